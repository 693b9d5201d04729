"""How long a slow structured-output schema stalls the other requests' streams (CPU, embedded model).

Before grammars compiled off the step loop, `add_request` compiled on the engine thread, so every running
stream stopped for the whole compile: that stall is the compile's own time, printed first (`compile on
the step loop`). Then, with the engine as it is, a free request decodes while a constrained request with
the slow schema is added mid-stream: the longest gap between two of the free request's steps is the stall
it sees now (the grammar compiles on a worker thread; xgrammar releases the GIL).

    OMP_NUM_THREADS=1 .venv/bin/python bench/grammar_compile_stall.py [--properties 100] [--depth 62]

`--properties N`: the schema has N string properties with bounded-repetition patterns (100: ~8.7 KB of
JSON, seconds to compile); `--depth D` also times D nested objects (62 is the deepest the server's body
bound, 128 nested containers, lets through).
"""

from __future__ import annotations

import argparse
import json
import time

from flotilla.engine.embedded_model import embedded_model_dir
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.structured_output.params import StructuredOutputsParams


def patterned(n: int, salt: int = 0) -> dict:
    """`n` string properties with bounded-repetition patterns (`salt` makes a schema no cache holds)."""
    props = {f"p{i}_{salt}": {"type": "string",
                              "pattern": f"^[a-z]{{{i % 7 + 1},{i % 7 + 40}}}-[0-9]{{2,30}}(x|y|z){{1,20}}$"}
             for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--properties", type=int, default=100)
    parser.add_argument("--depth", type=int, default=62)
    parser.add_argument("--free-tokens", type=int, default=64)
    args = parser.parse_args()
    llm = LLM(str(embedded_model_dir()), device="cpu", max_model_len=512)
    engine = llm.engine
    compiler = engine.grammar_compiler
    for name, schema in (("nested", nested(args.depth)), ("patterned", patterned(args.properties, 1))):
        start = time.perf_counter()
        compiler.compile(StructuredOutputsParams(json=schema))
        print(f"compile on the step loop ({name}, {len(json.dumps(schema))} chars): "
              f"{time.perf_counter() - start:.2f} s", flush=True)

    free = engine.add_request("Tell me a story.", SamplingParams(max_tokens=args.free_tokens, temperature=0,
                                                                 ignore_eos=True))
    slow = None
    gaps = []
    last = time.perf_counter()
    compile_start = compile_end = None
    while not free.status.finished:
        engine.step()
        now = time.perf_counter()
        if free.num_output_tokens:
            gaps.append(now - last)
        last = now
        if slow is None and free.num_output_tokens >= 4:
            compile_start = time.perf_counter()
            spec = StructuredOutputsParams(json=patterned(args.properties, 2))
            slow = engine.add_request("JSON:", SamplingParams(max_tokens=4, structured_outputs=spec))
        if slow is not None and compile_end is None and slow.request_id not in engine._compiling:
            compile_end = time.perf_counter()
    assert slow is not None and compile_start is not None
    during = f"{compile_end - compile_start:.2f} s" if compile_end else "still compiling"
    print(f"free request: {free.num_output_tokens} tokens, median step {sorted(gaps)[len(gaps) // 2] * 1e3:.1f} ms, "
          f"longest gap {max(gaps) * 1e3:.1f} ms; the slow grammar's wait when the stream ended: {during}",
          flush=True)
    engine.abort([slow.request_id])


if __name__ == "__main__":
    main()

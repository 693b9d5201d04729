"""Structured output's cost: decode ms/step with a JSON-schema constraint on every request against
none, and what a repeated schema pays to compile.

    python bench/structured.py --shape llama-3.1-8b --batch 64 --context 512 --steps 64 --json out.json

Random weights of the shape (`load_format=dummy`) and a byte-level tokenizer of the model's vocabulary
size (256 byte tokens, then every 2- and 3-character string of printable ASCII in order), so that JSON
is spellable token by token as with a real BPE vocabulary. Each request decodes under a schema whose
strings are unbounded, so no request finishes early and both runs time the same batch. The constraint
costs the host's bitmask fill (overlapped with the forward pass) and the mask's application on the
device. Compile: the first request with a schema compiles it; a second request with the same schema
must find it cached (`GrammarCompiler.num_compiled` unchanged, add_request time ~0).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import string
import time
from pathlib import Path

from decode_steps import start_decoding, timed_steps
from model_dirs import SHAPES, make_model_dir
from report import report

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "body": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["title", "body", "tags"]}


def byte_level_tokenizer(path: Path, vocab_size: int, eos: int) -> None:
    """Overwrite the directory's tokenizer with a byte-level BPE one of `vocab_size` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    printable = string.ascii_letters + string.digits + string.punctuation + " "
    spell = {chr(b): c for b, c in zip(range(256), sorted(byte_chars), strict=False)}
    for n in (2, 3):
        for combo in itertools.product(printable, repeat=n):
            if len(vocab) >= vocab_size:
                break
            token = "".join(spell.get(ch, ch) for ch in combo)
            vocab.setdefault(token, len(vocab))
    while len(vocab) < vocab_size:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    inverse = {i: t for t, i in vocab.items()}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=inverse[eos], bos_token=inverse[eos])
    fast.save_pretrained(path)


def decode_ms(engine, params, batch: int, context: int, steps: int, vocab: int) -> dict:
    """Mean ms per engine step once all `batch` requests decode (each step yields one token per request)."""
    rng = random.Random(0)
    reqs = [engine.add_request([rng.randrange(300, vocab) for _ in range(context)], params) for _ in range(batch)]
    start_decoding(engine, reqs)
    times = timed_steps(engine, steps)
    running = sum(not r.status.finished for r in reqs)
    engine.abort([r.request_id for r in reqs])
    while engine.has_unfinished_requests():
        engine.step()
    return {"ms_per_step": 1e3 * statistics.fmean(times), "ms_per_step_median": 1e3 * statistics.median(times),
            "still_running_at_end": running}


def main() -> None:
    from flotilla.engine.llm_engine import LLMEngine
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.engine.structured_output.params import StructuredOutputsParams

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--model-dir", default="/tmp/structured-model")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--json")
    a = p.parse_args()
    path = make_model_dir(a.shape, a.model_dir)
    cfg = SHAPES[a.shape]
    byte_level_tokenizer(path, cfg["vocab_size"], cfg["eos_token_id"])
    engine = LLMEngine.from_kwargs(str(path), load_format="dummy", max_model_len=a.context + 4 * a.steps + 64,
                                   max_num_seqs=a.batch, enable_prefix_caching=False)
    vocab = cfg["vocab_size"]
    free = SamplingParams(temperature=0.0, max_tokens=4 * a.steps + 32, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=4 * a.steps + 32,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    t = time.perf_counter()
    engine.grammar_compiler  # noqa: B018  (the vocabulary's one-time conversion, timed apart)
    tokenizer_info_s = time.perf_counter() - t
    compile_s = []
    for _ in range(2):
        t = time.perf_counter()
        engine.grammar_compiler.compile(constrained.structured_outputs)  # type: ignore[arg-type]
        compile_s.append(time.perf_counter() - t)
    result = {
        "shape": a.shape, "batch": a.batch, "context": a.context, "steps": a.steps,
        "tokenizer_info_s": tokenizer_info_s, "first_compile_s": compile_s[0], "second_compile_s": compile_s[1],
        "compilations": engine.grammar_compiler.num_compiled,
        "unconstrained": decode_ms(engine, free, a.batch, a.context, a.steps, vocab),
        "json_schema": decode_ms(engine, constrained, a.batch, a.context, a.steps, vocab),
    }
    result["overhead_pct"] = 100 * (result["json_schema"]["ms_per_step"] / result["unconstrained"]["ms_per_step"] - 1)
    report(result, a.json)


if __name__ == "__main__":
    main()

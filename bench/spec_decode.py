"""Speculative decoding: output tok/s and acceptance against no speculation, in one run.

    # CPU, the embedded SmolLM2, batch 1, a copy-heavy workload (repeat or lightly edit a passage):
    python bench/spec_decode.py --proposers none,ngram --k 4 --json out.json
    # GPU, Llama-3.1-8B shape with random weights: the mechanism's cost with a proposer that is always
    # right (it replays the non-speculative output) and one that is always wrong:
    python bench/spec_decode.py --model /tmp/llama8b --load-format dummy --workload random \\
        --proposers none,oracle-right,oracle-wrong --k 4 --batch 1 --json out.json

Every proposer runs on the same engine, one after another (`none` first: the oracles replay its
output): speculation is switched by swapping the engine's speculator, so weights load once. Requests
run in waves of `--batch` at once; tok/s is output tokens over the waves' wall time. Greedy; each
row says whether its tokens equal `none`'s.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine.spec_decode.config import SpeculativeConfig
from flotilla.engine.spec_decode.ngram_proposer import NgramProposer
from flotilla.engine.spec_decode.speculator import Speculator

PASSAGE = (
    "The harbour master kept a ledger of every boat that entered the bay. Each morning he wrote the "
    "name of the vessel, the hour of its arrival, the weight of its catch and the name of its captain. "
    "In winter the ledger grew thin, because storms kept the small boats at home, but in summer he "
    "filled three pages a day and his handwriting became smaller and smaller."
)
CODE = '''def total_weight(boats):
    total = 0
    for boat in boats:
        if boat.catch is not None:
            total = total + boat.catch.weight
    return total


def heaviest(boats):
    best = None
    for boat in boats:
        if best is None or boat.catch.weight > best.catch.weight:
            best = boat
    return best
'''
COPY_PROMPTS = [
    f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    f"Rewrite this Python code, renaming the variable `boats` to `fleet`. Output only the code.\n\n{CODE}",
    f"Copy this paragraph but replace 'harbour master' with 'lighthouse keeper':\n\n{PASSAGE}",
    f"Add a docstring to each function and output the full code:\n\n{CODE}",
]


class OracleProposer:
    """Benchmark-only: proposes the reference (non-speculative) continuation, or always a wrong token."""

    def __init__(self, reference: dict[str, list[int]], right: bool, vocab_size: int) -> None:
        self.reference = reference
        self.right = right
        self.vocab_size = vocab_size

    def propose(self, plan: SchedulerOutput, speculating: list[ScheduledRequest]) -> list[list[int]]:
        """The next tokens of each request's reference output (shifted by one id when wrong)."""
        del plan
        out = []
        for s in speculating:
            n = s.request.num_output_tokens
            want = self.reference[s.request.request_id][n : n + s.num_lookahead]
            out.append(want if self.right else [(t + 1) % self.vocab_size for t in want])
        return out


def _prompts(llm: LLM, workload: str, n: int, input_len: int) -> list[list[int]]:
    if workload == "copy":
        tok = llm.get_tokenizer()
        chats = [COPY_PROMPTS[i % len(COPY_PROMPTS)] for i in range(n)]
        texts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
                 for c in chats]
        return [tok.encode(t, add_special_tokens=False) for t in texts]
    rng = random.Random(0)
    vocab = llm.engine.vocab_size
    return [[rng.randrange(10, vocab) for _ in range(input_len)] for _ in range(n)]


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams, batch: int) -> tuple[dict[str, list[int]], float]:
    engine = llm.engine
    outputs: dict[str, list[int]] = {}
    start = time.perf_counter()
    for wave in range(0, len(prompts), batch):
        for i in range(wave, min(wave + batch, len(prompts))):
            engine.add_request(prompts[i], params, str(i))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = list(out.outputs[0].token_ids)
    return outputs, time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory (default: the embedded SmolLM2)")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--workload", choices=["copy", "random"], default="copy")
    p.add_argument("--proposers", default="none,ngram", help="none, ngram, oracle-right, oracle-wrong")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--prompt-lookup-max", type=int, default=5)
    p.add_argument("--disable-by-batch-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=args.k, prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max, disable_by_batch_size=args.disable_by_batch_size,
    )
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=max(args.batch, 1), speculative_config=spec.model_dump(exclude_none=True))
    engine = llm.engine
    prompts = _prompts(llm, args.workload, args.num_prompts, args.input_len)
    ignore_eos = args.workload == "random"
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=ignore_eos)
    _run(llm, prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), 1)  # warm-up
    results: dict[str, dict] = {}
    reference: dict[str, list[int]] = {}
    for name in args.proposers.split(","):
        if name == "none":
            engine.speculator = None
        elif name == "ngram":
            engine.speculator = Speculator(spec, NgramProposer(args.k, *spec.lookup_window))
        else:
            engine.speculator = Speculator(spec, OracleProposer(reference, name == "oracle-right", engine.vocab_size))
        outputs, seconds = _run(llm, prompts, params, args.batch)
        if name == "none":
            reference = outputs
        tokens = sum(map(len, outputs.values()))
        row = {"output_tokens": tokens, "seconds": round(seconds, 3), "output_tok_per_s": round(tokens / seconds, 2),
               # fp32 on the CPU: always True. In bf16 a verification pass (several query tokens per
               # sequence) may round differently from a decode step, and near-ties of random weights flip.
               "same_tokens_as_none": outputs == reference}
        if engine.speculator is not None:
            c = engine.speculator.counts
            row |= {"mean_acceptance_length": round(c.mean_acceptance_length, 3),
                    "draft_acceptance_rate": round(c.num_accepted_tokens / max(c.num_draft_tokens, 1), 3),
                    "num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
                    "num_accepted_tokens": c.num_accepted_tokens}
        results[name] = row
        print(name, json.dumps(row), flush=True)
    base = results.get("none", {}).get("output_tok_per_s")
    for row in results.values():
        if base:
            row["speedup"] = round(row["output_tok_per_s"] / base, 3)
    report = {"args": vars(args), "results": results}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

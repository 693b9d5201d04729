"""Speculative decoding: output tok/s and acceptance against no speculation, in one run.

    # CPU, the embedded SmolLM2, batch 1, a copy-heavy workload (repeat or lightly edit a passage):
    python bench/spec_decode.py --proposers none,ngram --k 4 --json out.json
    # GPU, Llama-3.1-8B shape with random weights: the mechanism's cost with a proposer that is always
    # right and one that is always wrong:
    python bench/spec_decode.py --model /tmp/llama8b --load-format dummy --workload random \\
        --proposers none,oracle-right,oracle-wrong --k 4 --batch 1 --json out.json

Every proposer runs on the same engine, one after another (`none` first: the oracles replay its
output): speculation is switched by swapping the engine's speculator, so weights load once. Each
proposer first runs one untimed wave (Triton compiles and autotunes its shapes there). Requests run
in waves of `--batch` at once; tok/s is output tokens over the waves' wall time, and decode tok/s
leaves out each wave's prefill: output tokens after each request's first, over the time from the
wave's last first token to its end. Greedy; each row says whether its tokens equal `none`'s.

The oracles measure the mechanism, not a proposer. `oracle-wrong` proposes the reference token + 1
(never accepted). `oracle-right` proposes the reference continuation and has every draft accepted
by a benchmark-only hook (`force_acceptance`): with random bf16 weights the verification pass's
argmax differs from the decode step's at near-ties, and after the first divergence an honest replay
would never be accepted again (acceptance 0.008 on the H200). The step itself is unchanged: the
k + 1-token verification pass, the argmax, the host's judging and the scheduler's bookkeeping all
run; the hook then reports every draft as accepted and outputs the drafts, then the bonus token.
Its output is therefore not the model's greedy output (`same_tokens_as_none` is not expected).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flotilla.engine import model_runner
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine.spec_decode.config import SpeculativeConfig
from flotilla.engine.spec_decode.ngram_proposer import NgramProposer
from flotilla.engine.spec_decode.rejection_sampler import DraftGroup
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


@contextmanager
def force_acceptance(enabled: bool) -> Iterator[None]:
    """Benchmark-only: every draft of a greedy verification step is accepted and output as proposed.

    Replaces the host's greedy judging (`greedy_accepted`, which the runner calls once per step
    with the argmax ids): the argmax and the bookkeeping still run, only the verdict is forced.
    """
    if not enabled:
        yield
        return
    real = model_runner.greedy_accepted

    def accept_all(token_ids: list[int], groups: list[DraftGroup]) -> list[bool]:
        accepted = [False] * len(token_ids)
        for g in groups:
            for j, draft in enumerate(g.draft_ids):
                token_ids[g.first_row + j] = draft
                accepted[g.first_row + j] = True
        return accepted

    model_runner.greedy_accepted = accept_all
    try:
        yield
    finally:
        model_runner.greedy_accepted = real


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


def _run(
    llm: LLM, prompts: list[list[int]], params: SamplingParams, batch: int
) -> tuple[dict[str, list[int]], float, float]:
    """Outputs by request id, the wall time, and the decode time (each wave from its last first token)."""
    engine = llm.engine
    outputs: dict[str, list[int]] = {}
    start = time.perf_counter()
    decode_s = 0.0
    for wave in range(0, len(prompts), batch):
        ids = [str(i) for i in range(wave, min(wave + batch, len(prompts)))]
        for rid in ids:
            engine.add_request(prompts[int(rid)], params, rid)
        first: dict[str, float] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.outputs[0].token_ids:
                    first.setdefault(out.request_id, time.perf_counter())
                if out.finished:
                    outputs[out.request_id] = list(out.outputs[0].token_ids)
        decode_s += time.perf_counter() - max(first.values(), default=start)
    return outputs, time.perf_counter() - start, decode_s


def _speculator(
    name: str, spec: SpeculativeConfig, reference: dict[str, list[int]], vocab_size: int
) -> Speculator | None:
    if name == "none":
        return None
    if name == "ngram":
        return Speculator(spec, NgramProposer(spec.num_speculative_tokens, *spec.lookup_window))
    if name in ("oracle-right", "oracle-wrong"):
        return Speculator(spec, OracleProposer(reference, name == "oracle-right", vocab_size))
    raise SystemExit(f"unknown proposer {name!r}")


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
    warm = prompts[: args.batch]
    results: dict[str, dict] = {}
    reference: dict[str, list[int]] = {}
    for name in args.proposers.split(","):
        with force_acceptance(name == "oracle-right"):
            engine.speculator = _speculator(name, spec, reference, engine.vocab_size)
            # Warm-up wave: the oracles replay `none`'s outputs of the same request ids.
            _run(llm, warm, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=ignore_eos), args.batch)
            engine.speculator = _speculator(name, spec, reference, engine.vocab_size)  # fresh counters
            outputs, seconds, decode_s = _run(llm, prompts, params, args.batch)
        if name == "none":
            reference = outputs
        tokens = sum(map(len, outputs.values()))
        decode_tokens = tokens - len(outputs)
        row = {"output_tokens": tokens, "seconds": round(seconds, 3), "output_tok_per_s": round(tokens / seconds, 2),
               "decode_seconds": round(decode_s, 3), "decode_tok_per_s": round(decode_tokens / max(decode_s, 1e-9), 2),
               # In bf16 a verification pass (several query rows, other GEMM shapes) may round differently
               # from a decode step, and near-ties of random weights flip; oracle-right outputs its drafts.
               "same_tokens_as_none": outputs == reference}
        if engine.speculator is not None:
            c = engine.speculator.counts
            row |= {"mean_acceptance_length": round(c.mean_acceptance_length, 3),
                    "draft_acceptance_rate": round(c.num_accepted_tokens / max(c.num_draft_tokens, 1), 3),
                    "num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
                    "num_accepted_tokens": c.num_accepted_tokens}
        results[name] = row
        print(name, json.dumps(row), flush=True)
    base = results.get("none", {})
    for row in results.values():
        if base:
            row["speedup"] = round(row["output_tok_per_s"] / base["output_tok_per_s"], 3)
            row["decode_speedup"] = round(row["decode_tok_per_s"] / base["decode_tok_per_s"], 3)
    report = {"args": vars(args), "results": results}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

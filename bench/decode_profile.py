"""Where a decode step's GPU time goes: kernel time per step by kernel, and the idle gaps between.

    python bench/decode_profile.py --shape llama-3.1-8b --batch-sizes 1,64 --context 512 --json out.json

For each batch size: `batch` requests of `--context` random tokens are prefilled, then `--steps`
engine steps are run under torch.profiler (CUDA activity). Reports per step: wall time, the summed
duration of every GPU kernel (the GPU's busy time), and the kernels grouped by name (µs per step,
launches per step), largest first. Wall minus busy is time the GPU sat idle: launch gaps inside
the graph and host work between steps. Run with and without --enforce-eager to compare.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import torch
from decode_steps import start_decoding
from model_dirs import SHAPES, make_model_dir
from report import report

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams
from flotilla.flags import flag

GROUPS = (  # kernel name fragment -> group, first match wins
    ("_decode_split", "attention"), ("split_merge", "attention"), ("_prefill_kernel", "attention"),
    ("_kv_write", "kv write"), ("rotary", "rotary"), ("rms", "rmsnorm"), ("silu", "silu_and_mul"),
    ("gemv", "gemm"), ("gemm", "gemm"), ("nvjet", "gemm"), ("cutlass", "gemm"), ("xmma", "gemm"),
)  # fmt: skip


def group_of(name: str) -> str:
    """The kernel's group by name fragment; 'other' for the rest (copies, argmax, indexing)."""
    lowered = name.lower()
    return next((g for fragment, g in GROUPS if fragment.lower() in lowered), "other")


def kernel_times(prof: Any, device_type: Any = torch.autograd.DeviceType.CUDA) -> dict[str, list[float]]:
    """[us, launches] of each kernel name the profiler `prof` saw on `device_type` (on the CPU, a smoke run's
    operators, each its own time)."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == device_type:
            entry = kernels[event.name]
            entry[0] += (
                event.device_time_total if device_type == torch.autograd.DeviceType.CUDA else event.self_cpu_time_total
            )
            entry[1] += 1
    return kernels


def grouped(kernels: dict[str, list[float]]) -> dict[str, float]:
    """us of each group of `kernel_times`' kernels."""
    groups: dict[str, float] = defaultdict(float)
    for name, (us, _) in kernels.items():
        groups[group_of(name)] += us
    return groups


def profile_batch(engine: LLMEngine, batch: int, context: int, steps: int, rng: random.Random) -> dict:
    """Prefill `batch` requests, then profile `steps` decode steps."""
    vocab = engine.config.model.hf_config["vocab_size"]
    # Long enough for every request to outlive the prefill steps (the first requests decode meanwhile) and the
    # profiled ones: with `steps + 16` alone, at batch 512 x context 576 (36 prefill steps at the default
    # 8,192-token budget) ~210 had finished before the 8 profiled steps, which then held ~300 to ~180 rows
    # (session 10's call 3: 10.07 ms of kernels a step, half the 512-row step's).
    # Session 12 call 1: at batch 64 x context 4,096 only 44 rows were left after the profiled steps with that
    # estimate (decode rows take from each prefill step's budget), so allow a step per request, within the model.
    prefill_steps = max(batch, -(-batch * context // engine.config.scheduler.max_num_batched_tokens))
    room = engine.config.model.max_model_len - context
    params = SamplingParams(temperature=0.0, max_tokens=min(steps + prefill_steps + 16, room), ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(context)], params) for _ in range(batch)]
    start_decoding(engine, reqs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    rows = sum(1 for r in reqs if not r.status.finished)
    engine.abort([r.request_id for r in reqs])
    kernels = kernel_times(prof)
    busy = sum(v[0] for v in kernels.values()) / steps
    by_group = {g: us / steps for g, us in grouped(kernels).items()}
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:25]
    return {
        "batch": batch,
        "running_rows": rows,  # requests still decoding after the profiled steps (batch, unless some finished)
        "context": context,
        "steps": steps,
        "wall_us_per_step": 1e6 * wall / steps,
        "gpu_busy_us_per_step": busy,
        "launches_per_step": sum(v[1] for v in kernels.values()) / steps,
        "groups_us_per_step": dict(sorted(by_group.items(), key=lambda kv: -kv[1])),
        "kernels": [
            {"name": name[:120], "us_per_step": us / steps, "launches_per_step": n / steps} for name, (us, n) in top
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--triton-gemv-max-rows", type=int, default=flag("--triton-gemv-max-rows").default)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    model_dir = str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    engine = LLMEngine.from_kwargs(
        model_dir, load_format="dummy", max_model_len=a.context + a.steps + 64, max_num_seqs=max(sizes),
        enable_prefix_caching=False, enforce_eager=a.enforce_eager, async_scheduling=a.async_scheduling,
        triton_gemv_max_rows=a.triton_gemv_max_rows,
    )  # fmt: skip
    rng = random.Random(0)
    result = {"command": "python bench/decode_profile.py " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "async_scheduling": engine.config.scheduler.async_scheduling, "profiles": []}  # fmt: skip
    for batch in sizes:
        r = profile_batch(engine, batch, a.context, a.steps, rng)
        result["profiles"].append(r)
        print(
            f"batch {batch}: wall {r['wall_us_per_step']:.0f} us/step, GPU busy {r['gpu_busy_us_per_step']:.0f}, "
            f"{r['launches_per_step']:.0f} kernels/step; "
            + ", ".join(f"{g} {us:.0f}" for g, us in r["groups_us_per_step"].items()),
            flush=True,
        )
        for k in r["kernels"][:12]:
            print(f"    {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f}  {k['name']}", flush=True)
    report(result, a.json, echo=False)


if __name__ == "__main__":
    main()

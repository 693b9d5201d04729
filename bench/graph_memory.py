"""What one engine's memory profile charged for its CUDA graphs against what their capture then took on the device
(engine/memory_profile.py, `graph_estimate`), with what the rule before it (vLLM's first + second x (n - 1), session
23) would have charged from the same first two samples and the KV blocks each leaves. One engine a process: a pool is
only given back to the device when its process ends.

    python bench/graph_memory.py --model /tmp/llama8b --name offline --max-model-len 656 --max-num-seqs 512 \\
        --max-num-batched-tokens 16384 --json offline.json

Prints one summary line (and writes its figures as JSON with --json). With --per-graph, the graphs are then captured
a second time into a pool of their own, one at a time in the capture's order (the engine's stay; ~1.5 GiB more of
the device for the 8B server's 110), each one's cost measured: a second line says where the memory goes (the first
graph, the others' outputs, what the others took beyond their outputs and the graphs that took most of that) and
what `graph_estimate` makes of the same graphs' samples; the JSON gets every graph's cost.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

import torch

from flotilla.engine.llm import LLM
from flotilla.engine.memory_profile import (
    GIB,
    MIN_GRAPH_BYTES,
    GraphSample,
    MemorySnapshot,
    graph_bytes,
    graph_estimate,
    graph_sample_indices,
)

MIB = 2**20


class _SampleLog(logging.Handler):
    """Keeps the arguments of the runner's "estimated ... captured first" line: the samples' costs and outputs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.args: tuple = ()

    def emit(self, record: logging.LogRecord) -> None:
        if "captured first" in str(record.msg) and isinstance(record.args, tuple):
            self.args = record.args


def per_graph(runner: Any) -> dict:
    """Every graph's cost captured one at a time, in order, into a fresh pool, and the estimate from its samples."""
    graphs = runner._step_graphs()
    keys = graphs.keys()
    costs, outputs = [], []
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = MemorySnapshot.measure(runner.device)
    for key in keys:
        graphs.capture([key])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = MemorySnapshot.measure(runner.device)
        costs.append(graph_bytes(before, after))
        outputs.append(graphs.output_bytes(key))
        before = after
    picked = graph_sample_indices([key.kind for key in keys])
    samples = [GraphSample(keys[i].tokens, costs[i], outputs[i], keys[i].kind in {k.kind for k in keys[:i]})
               for i in picked]
    names = [f"{k.kind[0]} {k.tokens}, width {k.width * runner.block_size}{', LoRA' if k.lora else ''}" for k in keys]
    beyond = sorted(((c - o, n) for n, c, o in zip(names[1:], costs[1:], outputs[1:], strict=True)), reverse=True)
    return {
        "total_gib": sum(costs) / GIB, "first_mib": costs[0] / MIB, "others_outputs_mib": sum(outputs[1:]) / MIB,
        "others_beyond_outputs_mib": sum(b for b, _ in beyond) / MIB,
        "most_beyond_outputs": [(round(b / MIB, 1), k) for b, k in beyond[:5]],
        "estimate_from_these_gib": graph_estimate(samples, [k.tokens for i, k in enumerate(keys) if i not in picked])
        / GIB,
        "graphs": [{"graph": n, "cost_mib": c / MIB, "output_mib": o / MIB}
                   for n, c, o in zip(names, costs, outputs, strict=True)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--per-graph", action="store_true", help="measure every graph's cost after start-up")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    samples = _SampleLog()
    logging.getLogger("flotilla.engine.model_runner").addHandler(samples)
    started = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, gpu_memory_utilization=args.gpu_memory_utilization,
              max_cudagraph_capture_size=args.max_cudagraph_capture_size)
    startup = time.perf_counter() - started
    runner = llm.engine.runner
    profile = runner.memory_profile
    assert profile is not None and runner.graphs is not None, "needs a CUDA device and CUDA graphs"
    num_graphs, costs, outputs = samples.args[1], samples.args[3], samples.args[4]
    old = int(costs[0] * MIB) + max(int(costs[1] * MIB) if len(costs) > 1 else 0, MIN_GRAPH_BYTES) * (num_graphs - 1)
    block = runner.bytes_per_block
    fig = {
        "name": args.name, "graphs": num_graphs, "samples_mib": costs, "sample_outputs_mib": outputs,
        "estimate_gib": profile.cuda_graphs / GIB, "captured_gib": runner.graph_bytes / GIB, "old_rule_gib": old / GIB,
        "profile_kept_gib": runner.graph_profile_kept / GIB,
        "kv_blocks": runner.num_blocks, "kv_gib": runner.num_blocks * block / GIB,
        "old_rule_kv_blocks": runner.num_blocks - -(-(old - profile.cuda_graphs) // block), "startup_s": startup,
        "capture_s": runner.graphs.capture_seconds,
    }
    held = runner.graph_bytes + runner.graph_profile_kept
    print(f"{args.name}: {num_graphs} graphs, estimate {fig['estimate_gib']:.2f} GiB vs captured "
          f"{fig['captured_gib']:.2f} GiB + {fig['profile_kept_gib']:.2f} GiB the profile's captures kept "
          f"({profile.cuda_graphs / max(held, 1):.2f}x; old rule "
          f"{fig['old_rule_gib']:.2f} GiB); KV {runner.num_blocks} blocks = {fig['kv_gib']:.2f} GiB (old rule "
          f"{fig['old_rule_kv_blocks']}); samples {costs} MiB, outputs {outputs} MiB; start-up {startup:.0f} s, "
          f"capture {fig['capture_s']:.1f} s", flush=True)
    if args.per_graph:
        curve = fig["per_graph"] = per_graph(runner)
        print(f"{args.name} per graph: {curve['total_gib']:.2f} GiB = first {curve['first_mib']:.0f} MiB + the others' "
              f"outputs {curve['others_outputs_mib']:.0f} MiB + beyond them {curve['others_beyond_outputs_mib']:.0f} "
              f"MiB (most: {curve['most_beyond_outputs']}); graph_estimate from these samples "
              f"{curve['estimate_from_these_gib']:.2f} GiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)


if __name__ == "__main__":
    main()

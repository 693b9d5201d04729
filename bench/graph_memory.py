"""What one engine's memory profile charged for its CUDA graphs against what their capture then took on the device
(engine/memory_profile.py, `graph_estimate`), with what the rule before it (vLLM's first + second x (n - 1), session
23) would have charged from the same first two samples and the KV blocks each leaves. One engine a process: a pool is
only given back to the device when its process ends.

    python bench/graph_memory.py --model /tmp/llama8b --name offline --max-model-len 656 --max-num-seqs 512 \\
        --max-num-batched-tokens 16384 --json offline.json

Prints one summary line (and writes its figures as JSON with --json).
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from flotilla.engine.llm import LLM
from flotilla.engine.memory_profile import GIB, MIN_GRAPH_BYTES

MIB = 2**20


class _SampleLog(logging.Handler):
    """Keeps the arguments of the runner's "estimated ... captured first" line: the samples' costs and outputs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.args: tuple = ()

    def emit(self, record: logging.LogRecord) -> None:
        if "captured first" in str(record.msg) and isinstance(record.args, tuple):
            self.args = record.args


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
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
        "kv_blocks": runner.num_blocks, "kv_gib": runner.num_blocks * block / GIB,
        "old_rule_kv_blocks": runner.num_blocks - -(-(old - profile.cuda_graphs) // block), "startup_s": startup,
        "capture_s": runner.graphs.capture_seconds,
    }
    print(f"{args.name}: {num_graphs} graphs, estimate {fig['estimate_gib']:.2f} GiB vs captured "
          f"{fig['captured_gib']:.2f} GiB ({profile.cuda_graphs / max(runner.graph_bytes, 1):.2f}x; old rule "
          f"{fig['old_rule_gib']:.2f} GiB); KV {runner.num_blocks} blocks = {fig['kv_gib']:.2f} GiB (old rule "
          f"{fig['old_rule_kv_blocks']}); samples {costs} MiB, outputs {outputs} MiB; start-up {startup:.0f} s, "
          f"capture {fig['capture_s']:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)


if __name__ == "__main__":
    main()

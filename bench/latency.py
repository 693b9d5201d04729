"""Decode latency: ms per step at fixed batch sizes and context lengths, Flotilla vs HF vs the roofline.

    python bench/latency.py --shape llama-3.1-8b --batch-sizes 1,16,64,256 --contexts 512,4096 \\
        --hf-batch-sizes 1 --json out.json

Flotilla: `batch` requests of `context` random prompt tokens are prefilled, then `--steps` whole
engine steps (scheduler, input staging, CUDA-graph replay, sampling, detokenization) are timed once
every request decodes; ms/step is their mean, host ms the runner's launch time (input preparation
and launches). With asynchronous scheduling (the default on CUDA; `--no-async-scheduling` turns it
off) a step call plans and launches the next step before it waits for the current one, so in steady
state a call lasts one GPU step whenever the host work is shorter.
HF: transformers `generate` with a static cache, compiled (torch.compile, "reduce-overhead"), in a
subprocess with its own random init of the same shape (speed does not depend on the values); ms/step
is the mean gap between streamed tokens after the first 8. Roofline: the bytes one decode step must
read (weights except the embedding table, plus the batch's K/V) at a copy bandwidth, or its FLOPs at
a bf16 GEMM rate, whichever is longer: `roofline_ms` / `x_roofline` at the H200's measured 4.28 TB/s
and 790 TFLOP/s (the figures the issues' floors are stated against, whatever card ran), and
`roofline_ms_card` / `x_roofline_card` at this card's own, measured in this process before the engine
starts (bench/card_peaks.py; both under "peaks" in the JSON; null on the CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from card_peaks import H200, Peaks, measured, peaks_json
from decode_steps import start_decoding, timed_steps
from model_dirs import SHAPES, make_model_dir
from report import report

from flotilla.flags import flag


def roofline_ms(cfg: dict, batch: int, context: int, peaks: Peaks = H200) -> float:
    """Lower bound of one decode step's time on a card of these `peaks` (bf16 weights and KV)."""
    h, layers, inter, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    d, kv = cfg.get("head_dim") or h // cfg["num_attention_heads"], cfg["num_key_value_heads"]
    per_layer = h * (cfg["num_attention_heads"] * d + 2 * kv * d) + cfg["num_attention_heads"] * d * h + 3 * h * inter
    params = layers * per_layer + vocab * h  # matmul weights + LM head (the embedding is a lookup)
    kv_bytes = batch * context * layers * 2 * kv * d * 2
    return 1e3 * max((2 * params + kv_bytes) / peaks.copy_bytes_per_s, 2 * params * batch / peaks.bf16_flops_per_s)


def add_rooflines(row: dict, cfg: dict, card: Peaks | None) -> dict:
    """`row` (a `step_latency` result) with its rooflines: `roofline_ms` / `x_roofline` against the H200's peaks,
    `roofline_ms_card` / `x_roofline_card` against `card`'s (None without a measured card)."""
    row["roofline_ms"] = roofline_ms(cfg, row["batch"], row["context"])
    row["x_roofline"] = row["ms_per_step"] / row["roofline_ms"]
    row["roofline_ms_card"] = roofline_ms(cfg, row["batch"], row["context"], card) if card else None
    row["x_roofline_card"] = row["ms_per_step"] / row["roofline_ms_card"] if card else None
    return row


def step_latency(engine, batch: int, context: int, steps: int, rng: random.Random) -> dict:
    """Mean time of `steps` whole engine steps once `batch` requests of `context` random tokens decode."""
    from flotilla.engine.sampling_params import SamplingParams

    vocab = engine.config.model.hf_config["vocab_size"]
    # The first requests decode while the others prefill: with more prefill steps than ~3 x steps some finish
    # before the timed steps end, and the timed batch is smaller than `batch` (`running_at_end` shows it;
    # bench/decode_profile.py's profile at 512 x 576 was, session 10).
    params = SamplingParams(temperature=0.0, max_tokens=4 * steps + 32, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(context)], params) for _ in range(batch)]
    start_decoding(engine, reqs)
    host, runner, graphed = [], [], []

    def read_runner() -> None:
        last = engine.runner.last_step
        host.append(last.host_s)
        runner.append(last.total_s)
        graphed.append(last.graphed)

    times = timed_steps(engine, steps, read_runner)
    running = sum(1 for r in reqs if not r.status.finished)
    engine.abort([r.request_id for r in reqs])
    return {
        "batch": batch,
        "context": context,
        "ms_per_step": 1e3 * statistics.fmean(times),
        "ms_per_step_median": 1e3 * statistics.median(times),
        "runner_host_ms": 1e3 * statistics.fmean(host),
        "runner_total_ms": 1e3 * statistics.fmean(runner),
        "graphed_steps": sum(graphed),
        "steps": steps,
        "running_at_end": running,  # requests still decoding after the timed steps (batch, unless some finished)
    }


def flotilla_latency(model_dir: str, batch_sizes: list[int], contexts: list[int], steps: int, a) -> list[dict]:
    from flotilla.engine.llm_engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine.from_kwargs(
        model_dir,
        load_format=a.load_format,
        max_model_len=max(contexts) + 4 * steps + 64,
        max_num_seqs=max(batch_sizes),
        max_num_batched_tokens=a.max_num_batched_tokens,
        enable_prefix_caching=False,
        enforce_eager=a.enforce_eager,
        async_scheduling=a.async_scheduling,
        gpu_memory_utilization=a.gpu_memory_utilization,
        triton_gemv_max_rows=a.triton_gemv_max_rows,
    )
    start_s = time.perf_counter() - t0
    rng = random.Random(0)
    results = []
    kv_capacity = engine.runner.num_blocks * engine.config.cache.block_size
    for context in contexts:
        for batch in batch_sizes:
            if batch * (context + 4 * steps + 64) > kv_capacity:
                results.append({"batch": batch, "context": context, "skipped": "KV cache too small"})
                continue
            results.append(step_latency(engine, batch, context, steps, rng))
            print(json.dumps(results[-1]), flush=True)
    runner = engine.runner
    return results, {
        "startup_s": start_s,
        "graph_capture_s": runner.graphs.capture_seconds if runner.graphs else None,
        "num_blocks": runner.num_blocks,
        "async_scheduling": engine.config.scheduler.async_scheduling,
    }


class _StepClock:
    """A `generate` streamer that stamps the time of every streamed token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_latency(model_dir: str, batch_sizes: list[int], context: int, steps: int) -> list[dict]:
    """HF static cache + torch.compile decode, one batch size after another (each compiles anew)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    out = []
    for batch in batch_sizes:
        ids = torch.randint(100, config.vocab_size, (batch, context), device="cuda")
        kwargs = dict(do_sample=False, max_new_tokens=steps + 8, min_new_tokens=steps + 8, pad_token_id=0,
                      cache_implementation="static", attention_mask=torch.ones_like(ids))
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, **kwargs)  # compiles
            compile_s = time.perf_counter() - t
            clock = _StepClock()
            model.generate(ids, streamer=clock, **kwargs)
        gaps = [b - a for a, b in zip(clock.times[9:], clock.times[10:], strict=False)]
        out.append({"batch": batch, "context": context, "ms_per_step": 1e3 * statistics.fmean(gaps),
                    "first_call_s": compile_s, "steps": len(gaps)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--model", default=None, help="an HF directory instead of --shape")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--batch-sizes", default="1,16,64,256")
    p.add_argument("--contexts", default="512,4096")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--triton-gemv-max-rows", type=int, default=flag("--triton-gemv-max-rows").default)
    p.add_argument("--hf-batch-sizes", default="", help="HF static+compile baseline at these batch sizes")
    p.add_argument("--hf-context", type=int, default=512)
    p.add_argument("--hf-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    model_dir = a.model or str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    cfg = json.loads(Path(model_dir, "config.json").read_text())
    hf_sizes = [int(x) for x in a.hf_batch_sizes.split(",") if x]
    if a.hf_only:
        print("HF_JSON " + json.dumps(hf_latency(model_dir, hf_sizes, a.hf_context, a.steps)))
        return
    result = {"command": "python bench/latency.py " + " ".join(sys.argv[1:]), "shape": a.shape,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__}
    card = measured()  # before HF's subprocess and the engine take the GPU's memory
    result["peaks"] = peaks_json(card)
    if hf_sizes:  # first, in its own process, so its compiled graphs and memory are gone before ours
        cmd = [sys.executable, __file__, "--hf-only", "--model", model_dir, "--hf-batch-sizes", a.hf_batch_sizes,
               "--hf-context", str(a.hf_context), "--steps", str(a.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("HF_JSON ")]
        result["hf_static_compile"] = json.loads(lines[-1][8:]) if lines else {"error": proc.stderr[-3000:]}
    batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    rows, info = flotilla_latency(model_dir, batch_sizes, contexts, a.steps, a)
    hf = {(r["batch"], r["context"]): r["ms_per_step"] for r in result.get("hf_static_compile", [])
          if isinstance(r, dict) and "ms_per_step" in r}
    for r in rows:
        if "ms_per_step" in r:
            add_rooflines(r, cfg, card)
            if (r["batch"], r["context"]) in hf:
                r["hf_ms_per_step"] = hf[(r["batch"], r["context"])]
                r["speedup_vs_hf"] = r["hf_ms_per_step"] / r["ms_per_step"]
    result.update(flotilla=rows, engine=info)
    print(f"{'batch':>5} {'ctx':>5} {'ms/step':>8} {'host ms':>8} {'roofline':>8} {'x roof':>6} {'card rf':>7}"
          f" {'x card':>6} {'HF ms':>7} {'runner':>7}")
    nan = float("nan")
    for r in rows:
        if "ms_per_step" in r:
            print(f"{r['batch']:>5} {r['context']:>5} {r['ms_per_step']:>8.2f} {r['runner_host_ms']:>8.2f} "
                  f"{r['roofline_ms']:>8.2f} {r['x_roofline']:>6.2f} {r['roofline_ms_card'] or nan:>7.2f} "
                  f"{r['x_roofline_card'] or nan:>6.2f} {r.get('hf_ms_per_step', nan):>7.2f} "
                  f"{r['runner_total_ms']:>7.2f}")
    report(result, a.json, echo=False)


if __name__ == "__main__":
    main()

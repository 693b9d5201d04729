"""One precision configuration of issue 22 on the GPU, in its own process: decode step latency, KV
blocks and offline throughput of the Llama-3.1-8B shape with random weights (`--load-format dummy`).

    python bench/quant_gpu.py --model /tmp/llama8b --name fp8 --quantization fp8 --jobs bs1,throughput \\
        --json fp8.json

Run once per configuration (bf16, fp8 weights, fp8 KV, both, int4 W4A16): an engine takes the GPU's
memory at start-up (the KV pool) and returns it only when its process ends, so
bench/results/quant-gpu.sh starts one process each and compares their JSON files. Jobs:
`bs1` decode step at batch 1, context 512; `bs64` at batch 64, context 4,096 (bench/latency.py's
measure: whole engine steps once every request decodes); `bs64ab` the bs64 step under the start-up decode launch
against each of `--relaunch`'s specs on the same requests, in the order A B B A (A B1 B2 B2 B1 A for two specs:
`ab_bs64`); `throughput` 1,000
random prompts of 512 tokens, 128 out (bench/throughput.py's workload); `greedy` the 32 greedy tokens after a
fixed 64-token prompt (the dummy weights are seeded: two runs of one model with different kernels should agree).
Each step figure comes with its roofline at the
configuration's own byte counts (fp8 weights 1 byte, int4 W4A16 g128 0.5 + a bf16 scale per 128;
the LM head and embeddings stay bf16; fp8 KV 1 byte): `roofline_ms` / `x_roofline` at the H200's peaks,
`roofline_ms_card` / `x_roofline_card` at this card's, measured before the engine starts (bench/card_peaks.py;
the JSON's "peaks"). The `bs1` job runs first, so a stage cut by its time limit still leaves its batch-1 figure.

With int4 weights `int4_paths` lists the same for the int4 GEMV (`int4_gemv_wide` too, the wide GEMV
taken with FLOTILLA_INT4_GEMV_WIDE=1), GEMM and dequantize + cuBLAS paths.
With fp8 weights the JSON's `fp8_paths` lists the input row counts M each fp8 linear path saw from the
start (the memory profile, CUDA-graph capture: M = each captured batch size) to the end: the W8A16 GEMV
(`fp8_gemv`, up to 16 rows) and W8A8 (`scaled_mm`). FLOTILLA_FP8_GEMV=0 in the environment runs the
old W8A8 path at every batch size (the before/after of the fp8 GEMV).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from card_peaks import H200, Peaks, measured, peaks_json, ratio
from latency import step_latency
from throughput import make_prompts, timed_generate

from flotilla.engine.llm import LLM

# bytes per matmul weight of each scheme (int4: 4 bits + one bf16 scale per group of 128)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128}


def roofline_ms(cfg: dict, batch: int, context: int, weight_bytes: float, kv_bytes: float,
                peaks: Peaks = H200) -> float:  # fmt: skip
    """Lower bound of one decode step on a card of these `peaks` at these weight and KV element sizes."""
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    matmul = layers * (h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * inter)
    lm_head = cfg["vocab_size"] * h
    read = matmul * weight_bytes + lm_head * 2 + batch * context * layers * 2 * kv * d * kv_bytes
    return 1e3 * max(read / peaks.copy_bytes_per_s, 2 * (matmul + lm_head) * batch / peaks.bf16_flops_per_s)


def rooflines(row: dict, cfg: dict, weight_bytes: float, kv_bytes: float, card: Peaks | None) -> dict:
    """`row` (a step figure of `batch` x `context`) with `roofline_ms` and `x_roofline` at the H200's peaks,
    `roofline_ms_card` and `x_roofline_card` at `card`'s (None without one; the x columns None for a row without
    one `ms_per_step`, as the A/B's)."""
    batch, context, ms = row["batch"], row["context"], row.get("ms_per_step")
    row["roofline_ms"] = roofline_ms(cfg, batch, context, weight_bytes, kv_bytes)
    row["x_roofline"] = ratio(ms, row["roofline_ms"])
    row["roofline_ms_card"] = roofline_ms(cfg, batch, context, weight_bytes, kv_bytes, card) if card else None
    row["x_roofline_card"] = ratio(ms, row["roofline_ms_card"])
    return row


def record_paths() -> dict[str, set[int]]:
    """Wrap the quantized GPU matmuls (looked up by the dispatch at each call) to note each call's rows:
    fp8 (`fp8_gemv`, `scaled_mm`) and int4 (`int4_gemv`, `int4_gemm`; `int4_dequant` notes the output
    features of each weight dequantized for cuBLAS, which is called without the input)."""
    from flotilla.kernels import fp8_scaled_mm, triton_gemv, triton_int4_gemm, triton_int4_gemv, triton_int4_gemv_wide

    keys = ("fp8_gemv", "scaled_mm", "int4_gemv", "int4_gemv_wide", "int4_gemm", "int4_dequant")
    seen: dict[str, set[int]] = {k: set() for k in keys}

    def counted(fn: Callable, key: str) -> Callable:
        def call(x, *args, **kwargs):
            seen[key].add(x.numel() // x.shape[-1])
            return fn(x, *args, **kwargs)

        return call

    triton_gemv.fp8_gemv = counted(triton_gemv.fp8_gemv, "fp8_gemv")
    fp8_scaled_mm.fp8_linear_scaled_mm = counted(fp8_scaled_mm.fp8_linear_scaled_mm, "scaled_mm")
    triton_int4_gemv.int4_gemv = counted(triton_int4_gemv.int4_gemv, "int4_gemv")
    triton_int4_gemv_wide.int4_gemv_wide = counted(triton_int4_gemv_wide.int4_gemv_wide, "int4_gemv_wide")
    triton_int4_gemm.int4_linear = counted(triton_int4_gemm.int4_linear, "int4_gemm")
    triton_int4_gemm.int4_dequantize = counted(triton_int4_gemm.int4_dequantize, "int4_dequant")
    return seen


_LAUNCH_ENV = ("FLOTILLA_DECODE_FP8_LAUNCH", "FLOTILLA_DECODE_WAVE", "FLOTILLA_DECODE_FUSED_MERGE",
               "FLOTILLA_DECODE_FP8_LEAN")  # fmt: skip


def _set_launch(spec: str) -> dict[str, str]:
    """Set the decode launch's environment from `spec` = FLOTILLA_DECODE_FP8_LAUNCH[@FLOTILLA_DECODE_WAVE[@fused]
    [@lean]] (fused: FLOTILLA_DECODE_FUSED_MERGE=1; lean: FLOTILLA_DECODE_FP8_LEAN=1; `default`: all unset);
    returns what it set."""
    launch, wave, *flags = (("" if spec == "default" else spec).split("@") + [""])[:4]
    flags = [f for f in flags if f]
    assert set(flags) <= {"fused", "lean"}, f"--relaunch {spec!r}: LAUNCH[@WAVE[@fused][@lean]]"
    env = dict(zip(_LAUNCH_ENV, (launch, wave, "1" if "fused" in flags else "", "1" if "lean" in flags else ""),
                   strict=True))  # fmt: skip
    for name, value in env.items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    return {name: value or "default" for name, value in env.items()}


def _recapture_decode(engine, batch: int) -> float:
    """Capture the engine's decode graphs of `batch` rows again (every table width; the other graphs keep theirs):
    the decode kernel reads its launch's environment at each call, so a graph holds the launch of its capture.
    Padding rows write no KV (slot -1), so live requests are safe. Returns the seconds it took."""
    from flotilla.engine.cuda_graphs import StepGraphs

    graphs = engine.runner.graphs
    t0 = time.perf_counter()
    if graphs is not None:
        keys = [k for k in StepGraphs.keys(graphs) if k.decode and k.tokens == batch]
        for key in keys:
            graphs._graphs.pop(key, None)
        graphs.keys = lambda: keys  # capture() walks keys(): only these
        try:
            graphs.capture()
        finally:
            del graphs.keys
    return time.perf_counter() - t0


def relaunch_bs64(engine, spec: str, steps: int, rng: random.Random) -> dict:
    """The bs64 step again under another decode launch in the same engine (session 11, fp8kv11: one engine start
    for main's fp8 kernel and a branch's): the launch set from `spec` (`_set_launch`), the batch-64 decode graphs
    captured again, new requests prefilled and timed (`step_latency`)."""
    env = _set_launch(spec)
    capture_s = _recapture_decode(engine, 64)
    row = step_latency(engine, 64, 4096, steps, rng)
    row["recapture_s"] = capture_s
    row["env"] = env
    return row


def ab_phases(specs: list[str]) -> list[tuple[str, int]]:
    """The phases of `ab_bs64` as (name, index into `specs`; -1: A): A, each spec, the specs again backwards, A, so
    that a linear drift (the context grows ~35 tokens a phase) weighs on every side alike."""
    named = [(f"B{i + 1}" if len(specs) > 1 else "B", i) for i in range(len(specs))]
    return [("A", -1), *named, *named[::-1], ("A", -1)]


def ab_bs64(engine, specs: list[str], steps: int, rng: random.Random) -> dict:
    """Job `bs64ab`: the start-up launch (A) against each spec of `specs` (B; B1, B2, ... for several) on the same 64
    requests of 4,096 tokens, prefilled once, in the order of `ab_phases` (A B B A for one spec; each phase: the
    batch-64 decode graphs captured again under its launch, 3 settling steps, `steps` timed ones). A's and each B's
    figures are the means of their two phases; `b_spec` / `b_ms` are the first spec's, `b` lists every spec's."""
    import statistics

    from decode_steps import start_decoding, timed_steps

    from flotilla.engine.sampling_params import SamplingParams

    start = {name: os.environ.get(name) for name in _LAUNCH_ENV}
    a_spec = "@".join([start[_LAUNCH_ENV[0]] or "", start[_LAUNCH_ENV[1]] or ""] +
                      (["fused"] if start[_LAUNCH_ENV[2]] == "1" else []) +
                      (["lean"] if start[_LAUNCH_ENV[3]] == "1" else [])).rstrip("@") or "default"  # fmt: skip
    order = ab_phases(specs)
    vocab = engine.config.model.hf_config["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=len(order) * (steps + 3) + 32, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(4096)], params) for _ in range(64)]
    start_decoding(engine, reqs, settle=0)
    phases = []
    for name, index in order:
        which = a_spec if index < 0 else specs[index]
        env = _set_launch(which)
        capture_s = _recapture_decode(engine, 64) if phases and phases[-1]["name"] != name else 0.0
        graphed: list[bool] = []
        for _ in range(3):
            engine.step()
        times = timed_steps(engine, steps, lambda seen=graphed: seen.append(engine.runner.last_step.graphed))
        phases.append({"name": name, "spec": which, "env": env, "ms_per_step": 1e3 * statistics.fmean(times),
                       "ms_per_step_median": 1e3 * statistics.median(times), "graphed_steps": sum(graphed),
                       "recapture_s": capture_s})  # fmt: skip
    running = sum(1 for r in reqs if not r.status.finished)
    engine.abort([r.request_id for r in reqs])
    mean = {k: statistics.fmean(p["ms_per_step"] for p in phases if p["name"] == k) for k, _ in order}
    b = [{"spec": specs[i], "ms": mean[k]} for k, i in order[1 : 1 + len(specs)]]
    return {"batch": 64, "context": 4096, "steps": steps, "a_spec": a_spec, "b_spec": specs[0], "a_ms": mean["A"],
            "b_ms": b[0]["ms"], "b": b, "phases": phases, "running_at_end": running}  # fmt: skip


def model_len_extra(jobs: list[str], specs: list[str], steps: int) -> int:
    """Tokens past the 4,096-token prompts the engine's max_model_len allows: 4 x steps + 64 (what every job has
    had: A B B A's requests take 4 x (steps + 3) + 32), or 64 more than the requests take where `bs64ab` runs more
    phases of steps + 3 on them (several specs)."""
    phases = len(ab_phases(specs)) if "bs64ab" in jobs else 4
    return 4 * steps + 64 if phases <= 4 else phases * (steps + 3) + 96


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--weights", default=None, choices=sorted(WEIGHT_BYTES), help="for the roofline (default: name)")
    p.add_argument("--jobs", default="bs1")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--json", required=True)
    p.add_argument(
        "--relaunch",
        default="",
        help="after the jobs, ';'-separated LAUNCH[@WAVE[@fused][@lean]]: for each, FLOTILLA_DECODE_FP8_LAUNCH=LAUNCH, "
        "FLOTILLA_DECODE_WAVE=WAVE, FLOTILLA_DECODE_FUSED_MERGE, FLOTILLA_DECODE_FP8_LEAN (`default`: all unset), the "
        "decode graphs of batch 64 captured again and the bs64 step measured again (JSON `relaunch`); with job bs64ab "
        "every spec is a B side of one A/B on the same requests (`ab_bs64`)",
    )
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Start-up phases with timestamps (model build, quantized layers, dummy fill, each graph captured):
    # a run cut by its time limit says where it was.
    for name in ("flotilla.engine.model_loader", "flotilla.engine.cuda_graphs"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    jobs = a.jobs.split(",")
    paths = record_paths() if torch.cuda.is_available() else None
    card = measured()  # before the engine takes the GPU's memory
    logging.getLogger("quant_gpu").info("%s: starting the engine (%s)", a.name, a.model)
    t0 = time.perf_counter()
    specs = [spec or "default" for spec in a.relaunch.split(";")]
    llm = LLM(a.model, load_format="dummy", max_model_len=4096 + model_len_extra(jobs, specs, a.steps),
              max_num_seqs=a.max_num_seqs, max_num_batched_tokens=16384, enable_prefix_caching=False,
              quantization=a.quantization, kv_cache_dtype=a.kv_cache_dtype)  # fmt: skip
    engine = llm.engine
    cfg = engine.config.model.hf_config
    weight_bytes = WEIGHT_BYTES[a.weights or ("int4" if "int4" in a.name else "fp8" if a.quantization else "bf16")]
    kv_bytes = torch.empty(0, dtype=engine.runner.kv_dtype).element_size()
    result: dict = {
        "name": a.name,
        "fp8_gemv_env": os.environ.get("FLOTILLA_FP8_GEMV", "1"),
        "int4_gemv_wide_env": os.environ.get("FLOTILLA_INT4_GEMV_WIDE", ""),
        "int4_gemv_wide_config": os.environ.get("FLOTILLA_INT4_GEMV_WIDE_CONFIG", ""),
        "switches": {
            k: os.environ.get(k)
            for k in (
                "FLOTILLA_PDL",
                "FLOTILLA_PDL_L2_MB",
                "FLOTILLA_DECODE_FP8_LAUNCH",
                "FLOTILLA_DECODE_WAVE",
                "FLOTILLA_DECODE_FUSED_MERGE",
                "FLOTILLA_DECODE_FP8_LEAN",
            )
        },
        "quantization": engine.config.model.quantization,
        "kv_dtype": str(engine.runner.kv_dtype).removeprefix("torch."),
        "startup_s": time.perf_counter() - t0,
        "num_blocks": engine.runner.num_blocks,
        "block_size": engine.config.cache.block_size,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "peaks": peaks_json(card),
    }

    def save() -> None:
        if paths is not None and a.quantization:
            result["fp8_paths"] = {key: sorted(rows) for key, rows in paths.items() if key in ("fp8_gemv", "scaled_mm")}
        if paths is not None and (a.weights or a.name) == "int4":
            result["int4_paths"] = {key: sorted(rows) for key, rows in paths.items() if key.startswith("int4")}
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
        print("QUANT_JSON " + json.dumps(result), flush=True)

    save()
    rng = random.Random(0)
    for job in jobs:
        if job in ("bs1", "bs64"):
            batch, context = (1, 512) if job == "bs1" else (64, 4096)
            result[job] = rooflines(step_latency(engine, batch, context, a.steps, rng), cfg, weight_bytes, kv_bytes,
                                    card)  # fmt: skip
        elif job == "greedy":
            from flotilla.engine.sampling_params import SamplingParams

            prompt = [random.Random(1).randrange(100, cfg["vocab_size"]) for _ in range(64)]
            greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
            out = llm.generate([prompt], greedy, use_tqdm=False)
            result[job] = list(out[0].outputs[0].token_ids)
        elif job == "throughput":
            prompts = make_prompts(1000, 512, cfg["vocab_size"], 0, False)
            result[job] = timed_generate(llm, prompts, 128)
        save()
    if "bs64ab" in jobs:  # the start-up launch against every --relaunch spec, same requests (`ab_bs64`)
        result["bs64ab"] = rooflines(ab_bs64(engine, specs, a.steps, rng), cfg,
                                     weight_bytes, kv_bytes, card)  # fmt: skip
        save()
    for spec in a.relaunch.split(";") if a.relaunch and "bs64ab" not in jobs else ():
        row = relaunch_bs64(engine, spec, a.steps, rng)
        result.setdefault("relaunch", {})[spec] = rooflines(row, cfg, weight_bytes, kv_bytes, card)
        save()
    # Everything is saved: skip the engine's teardown (a stage's time limit once ran out in it).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

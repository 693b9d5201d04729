"""Offline throughput: N requests with fixed lengths (ignore_eos), Flotilla vs HF transformers `generate`.

    python bench/throughput.py --num-prompts 16 --input-len 128 --output-len 64 --hf --json out.json

Without --model it runs the embedded SmolLM2-135M-Instruct; `--shape llama-3.1-8b --load-format dummy`
runs random weights of that shape (bench/model_dirs.py). Prompts are random token ids, as
`vllm bench throughput --dataset-name random`. The HF baseline runs the same prompts as one static
batch through `generate` (greedy, exactly output-len new tokens), on the same weights and dtype;
`--hf-cb` runs HF continuous batching (`generate_batch`) on the first `--hf-num-prompts` prompts, in
a subprocess with HF's own random init of the shape. `bound_s` is the workload's lower bound on the
H200: max(FLOPs / 790 TFLOP/s, bytes / 4.28 TB/s) (weights read once per step, K/V written and read);
`serial_s` is the best an engine running a layer's kernels one after another can do (`serial_seconds`).
`bound` and `fraction_of_bound` / `fraction_of_serial` are against the H200's peaks (issue 19's floor is stated
against them, whatever card ran); `bound.card` and `fraction_of_bound_card` / `fraction_of_serial_card` the same
at this card's peaks, measured before the engine starts (bench/card_peaks.py; the JSON's "peaks"; null on the CPU
and with -tp/-pp above 1).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from card_peaks import H200, Peaks, measured, peaks_json
from report import report

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


def make_prompts(n: int, input_len: int, vocab: int, seed: int, mixed: bool) -> list[list[int]]:
    """Random token-id prompts; with `mixed`, lengths uniform in [input_len/2, input_len*3/2]."""
    rng = random.Random(seed)
    lengths = [rng.randint(input_len // 2, input_len * 3 // 2) if mixed else input_len for _ in range(n)]
    return [[rng.randrange(100, vocab) for _ in range(length)] for length in lengths]


def timed_generate(llm: LLM, prompts: list[list[int]], output_len: int, tokens_out: str | None = None) -> dict:
    """Generate `output_len` tokens for every prompt on a built engine: wall time and tokens/s. `tokens_out`: a
    file for the timed run's greedy tokens (one JSON list a request, in order), for an A/B to compare."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    # Warm-up on the workload's own shapes (CPU GEMM kernels are built per shape), 8 tokens each, with
    # other tokens of the same lengths so the measured prompts are not already in the prefix cache.
    shuffled = [[(t * 7919 + 17) % (max(p) + 1) or 1 for t in p] for p in prompts]
    llm.generate(shuffled, SamplingParams(temperature=0.0, max_tokens=min(8, output_len), ignore_eos=True),
                 use_tqdm=False)
    pauses = _GcPauses()
    retries = _alloc_retries()
    start = time.perf_counter()
    with pauses:
        outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    if tokens_out:
        Path(tokens_out).write_text(json.dumps([list(o.outputs[0].token_ids) for o in outs]))
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(map(len, prompts))
    return {
        # Host stalls inside the timed run: full garbage-collector passes  and the CUDA
        # allocator's free-and-retry (a device sync).
        "gc_full_passes": len(pauses.full_ms), "gc_full_ms": round(sum(pauses.full_ms), 1),
        "cuda_alloc_retries": None if retries is None else _alloc_retries() - retries,
        "seconds": elapsed,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (generated + prompt_tokens) / elapsed,
        "requests_per_s": len(prompts) / elapsed,
        "num_steps": llm.engine.stats.num_steps,
    }


class _GcPauses:
    """Durations of the garbage collector's full (generation-2) passes while the context is open."""

    def __init__(self) -> None:
        self.full_ms: list[float] = []
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.full_ms.append(1e3 * (time.perf_counter() - self._start))

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def _alloc_retries() -> int | None:
    """The CUDA caching allocator's retries after freeing its cache (each one syncs the device), or None."""
    return torch.cuda.memory_stats().get("num_alloc_retries", 0) if torch.cuda.is_available() else None


def run_flotilla(model: str | None, prompts: list[list[int]], output_len: int, engine_args: dict,
                 tokens_out: str | None = None) -> dict:
    """Generate with Flotilla; returns wall time and output tokens/s (load and warm-up excluded)."""
    t0 = time.perf_counter()
    llm = LLM(model, **engine_args)
    startup = time.perf_counter() - t0
    return {**timed_generate(llm, prompts, output_len, tokens_out), "startup_s": startup,
            "model_dir": llm.engine.config.model.model, "dtype": llm.engine.config.model.dtype,
            "async_scheduling": llm.engine.config.scheduler.async_scheduling}


def run_hf_cb(model_dir: str, prompts: list[list[int]], output_len: int) -> dict:
    """HF continuous batching (`generate_batch`, paged attention) on HF's random init of the shape."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    errors = []
    for attn in ("paged|sdpa", "sdpa_paged", "sdpa"):
        try:
            with torch.device("cuda"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=attn).eval()
            gen = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
            model.generate_batch(inputs=[p[:16] for p in prompts[:4]], generation_config=gen)  # warm-up
            start = time.perf_counter()
            outs = model.generate_batch(inputs=prompts, generation_config=gen)
            elapsed = time.perf_counter() - start
            generated = sum(len(o.generated_tokens) for o in outs.values())
            return {"attn_implementation": attn, "num_prompts": len(prompts), "seconds": elapsed,
                    "output_tokens": generated, "output_tokens_per_s": generated / elapsed}
        except Exception as exc:
            errors.append(f"{attn}: {type(exc).__name__}: {exc}"[:500])
            model = None
            torch.cuda.empty_cache()
    return {"error": errors}


def bound_seconds(cfg: dict, prompts: list[list[int]], output_len: int, max_num_seqs: int,
                  peaks: Peaks = H200) -> dict:  # fmt: skip
    """max(FLOPs / GEMM rate, bytes / copy bandwidth) for the workload (bf16 weights and KV) at `peaks` (the H200's:
    790 TFLOP/s, 4.28 TB/s)."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    params = layers * (h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * cfg["intermediate_size"])
    params += cfg["vocab_size"] * h
    tokens = sum(len(p) + output_len for p in prompts)
    attn_flops = sum(4 * layers * heads * d * sum(range(len(p) + output_len)) for p in prompts)
    flops = 2 * params * tokens + attn_flops
    waves = -(-len(prompts) // max_num_seqs)
    kv_token = layers * 2 * kv * d * 2
    kv_read = sum(kv_token * sum(range(len(p), len(p) + output_len)) for p in prompts)
    bytes_moved = 2 * params * waves * output_len + kv_read + kv_token * tokens
    compute_s, memory_s = flops / peaks.bf16_flops_per_s, bytes_moved / peaks.copy_bytes_per_s
    return {"flops": flops, "bytes": bytes_moved, "compute_s": compute_s, "memory_s": memory_s,
            "bound_s": max(compute_s, memory_s),
            "serial": serial_seconds(cfg, params, tokens, len(prompts) * output_len, attn_flops, kv_read, peaks)}


def serial_seconds(cfg: dict, params: int, tokens: int, sampled: int, attn_flops: int, kv_read: int,
                   peaks: Peaks = H200) -> dict:  # fmt: skip
    """The best time of an engine that runs a layer's kernels one after another (as Flotilla does): every GEMM
    FLOP at the GEMM rate of `peaks`, and the decode steps' K/V reads and the elementwise kernels' bytes (two
    add+RMSNorms, SiLU-mul, rotary, K/V write) at its copy bandwidth on top of them, not hidden under them (the
    H200's: 790 TFLOP/s, 4.28 TB/s). The LM head runs for sampled
    tokens only (the bound above counts it for every token). `fraction_of_bound` cannot exceed
    `bound_s / seconds` of this, whatever the kernels, unless attention or elementwise work overlaps the GEMMs."""
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    linear = params - cfg["vocab_size"] * h
    gemm_s = (2 * linear * tokens + 2 * cfg["vocab_size"] * h * sampled + attn_flops) / peaks.bf16_flops_per_s
    elementwise = layers * (2 * 4 * h + 3 * inter + 2 * (heads + kv) * d + 2 * kv * d) * 2  # bf16 bytes a token
    kv_s, elementwise_s = kv_read / peaks.copy_bytes_per_s, elementwise * tokens / peaks.copy_bytes_per_s
    return {"gemm_s": gemm_s, "kv_read_s": kv_s, "elementwise_s": elementwise_s,
            "serial_s": gemm_s + kv_s + elementwise_s}


def fractions(cfg: dict, prompts: list[list[int]], output_len: int, max_num_seqs: int, seconds: float,
              card: Peaks | None) -> dict:  # fmt: skip
    """The JSON's bounds of a run that took `seconds`: `bound` at the H200's peaks with `bound.card` (the same
    seconds at `card`'s peaks, None without one) inside, and the fractions of each that the run reached."""
    bound = bound_seconds(cfg, prompts, output_len, max_num_seqs)
    on_card = bound_seconds(cfg, prompts, output_len, max_num_seqs, card) if card else None
    bound["card"] = {k: v for k, v in on_card.items() if k not in ("flops", "bytes")} if on_card else None
    return {"bound": bound, "fraction_of_bound": bound["bound_s"] / seconds,
            "fraction_of_serial": bound["serial"]["serial_s"] / seconds,
            "fraction_of_bound_card": on_card["bound_s"] / seconds if on_card else None,
            "fraction_of_serial_card": on_card["serial"]["serial_s"] / seconds if on_card else None}  # fmt: skip


def run_hf(model_dir: str, dtype: str, prompts: list[list[int]], output_len: int) -> dict:
    """HF transformers `generate` on the prompts as one left-padded static batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        # Warm-up on the same batch, 8 tokens, as for Flotilla.
        model.generate(ids, attention_mask=mask, max_new_tokens=min(8, output_len), do_sample=False, pad_token_id=0)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kwargs)
        elapsed = time.perf_counter() - start
    generated = (out.shape[1] - width) * len(prompts)
    return {"seconds": elapsed, "output_tokens_per_s": generated / elapsed}


def main() -> None:
    """Parse arguments, run both engines, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--shape", default=None, help="random weights of a known shape (bench/model_dirs.py)")
    p.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None,
                   help="capture mixed-step graphs up to this many tokens (the engine's flag)")
    p.add_argument("--hf-cb", action="store_true", help="HF continuous batching baseline (GPU)")
    p.add_argument("--hf-num-prompts", type=int, default=256)
    p.add_argument("--hf-cb-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--mixed", action="store_true", help="random-mixed prompt lengths")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--hf", action="store_true", help="also run the HF transformers baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--tokens-out", default=None, help="write the timed run's greedy tokens here (JSON)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Before any engine or HF model takes the GPU's memory. Not with spawned workers: this process's CUDA context
    # would sit on their first GPU (memory their KV pool would not get), and the bounds are one card's anyway.
    one_card = a.tensor_parallel_size * a.pipeline_parallel_size == 1
    card = measured() if one_card else None
    torch.manual_seed(a.seed)
    if a.shape:
        from model_dirs import make_model_dir

        a.model = a.model or str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    engine_args = {"dtype": a.dtype, "max_num_seqs": a.max_num_seqs, "async_scheduling": a.async_scheduling,
                   "tensor_parallel_size": a.tensor_parallel_size, "pipeline_parallel_size": a.pipeline_parallel_size}
    if a.load_format != "auto":
        engine_args["load_format"] = a.load_format
    if a.max_num_batched_tokens:
        engine_args["max_num_batched_tokens"] = a.max_num_batched_tokens
    if a.max_cudagraph_capture_size:
        engine_args["max_cudagraph_capture_size"] = a.max_cudagraph_capture_size
    if a.model is not None:
        hf_config = json.loads(Path(a.model, "config.json").read_text())
    else:
        hf_config = LLM(None, **engine_args, max_model_len=64).engine.config.model.hf_config
    prompts = make_prompts(a.num_prompts, a.input_len, hf_config["vocab_size"], a.seed, a.mixed)
    if a.hf_cb_only:
        print("HF_JSON " + json.dumps(run_hf_cb(a.model, prompts[: a.hf_num_prompts], a.output_len)))
        return
    longest = max(map(len, prompts)) + a.output_len
    engine_args["max_model_len"] = -(-longest // 16) * 16 + 16
    result = {
        "command": "python bench/throughput.py " + " ".join(__import__("sys").argv[1:]),
        "workload": {
            "num_prompts": a.num_prompts,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "mixed": a.mixed,
        },
        "machine": {
            "cpu_count": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "peaks": peaks_json(card) if one_card else peaks_json(None, "tp x pp > 1: one card's peaks, not measured"),
    }
    if a.hf_cb:  # first, in its own process, so its memory is gone before the engine sizes its KV cache
        cmd = [sys.executable, __file__, "--hf-cb-only", "--model", a.model, "--num-prompts", str(a.num_prompts),
               "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(a.seed),
               "--hf-num-prompts", str(a.hf_num_prompts)] + (["--mixed"] if a.mixed else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("HF_JSON ")]
        result["hf_continuous_batching"] = json.loads(lines[-1][8:]) if lines else {"error": proc.stderr[-3000:]}
    result["flotilla"] = run_flotilla(a.model, prompts, a.output_len, engine_args, a.tokens_out)
    result.update(fractions(hf_config, prompts, a.output_len, a.max_num_seqs, result["flotilla"]["seconds"], card))
    cb = result.get("hf_continuous_batching", {})
    if "output_tokens_per_s" in cb:
        result["speedup_vs_hf_cb"] = result["flotilla"]["output_tokens_per_s"] / cb["output_tokens_per_s"]
    if a.hf:
        result["hf_generate"] = run_hf(
            result["flotilla"]["model_dir"], result["flotilla"]["dtype"], prompts, a.output_len
        )
        result["speedup"] = result["flotilla"]["output_tokens_per_s"] / result["hf_generate"]["output_tokens_per_s"]
    report(result, a.json)


if __name__ == "__main__":
    main()

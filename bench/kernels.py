"""Microbenchmarks of the Triton kernels against their anchors, on one CUDA GPU, in one run.

    python3 bench/kernels.py --out results.json [--sections decode,prefill,elementwise] [--sweep decode,...]

- Copy bandwidth (the ceiling for the memory-bound kernels): a 1 GiB device-to-device copy,
  bytes read + written over time.
- Paged decode, Llama-3-8B heads (32 q / 8 kv / 128), bf16, 16-token pages, shuffled block tables,
  batch 1/16/64/256 x 4,096 context: GB/s = K+V bytes read / time, against torch SDPA on the same
  K/V gathered into contiguous tensors, measured the same way in the same run. Batch 1 and 16
  are timed by replaying many calls captured in one CUDA graph, rotating over several K/V sets so
  that no call finds its K/V in L2; batch 64 and 256 with `triton.testing.do_bench` (median).
- Paged prefill 8 x 2,048 causal: TFLOP/s (4 * B * H * D * N^2 / 2) against SDPA (is_causal); and an
  extend case (1,536 cached + 512 new tokens per sequence) for information.
- RMSNorm + residual, rotary, SiLU-and-mul, KV write at 8,192 tokens x 4,096: GB/s of the bytes they
  must move, against the copy bandwidth (and torch eager for information).
- GEMV (`--sections gemv`, not in the default run): decode-time linear layers of Llama-3.1-8B
  (qkv, o, gate_up, down; bf16 weight `[N, K]`) at M = 1 and 4 rows: GB/s of weight read, against
  F.linear (cuBLAS), both timed in one CUDA graph of many calls rotating over >= 3 weight copies so
  that no call finds its weight in L2.
`--sections` picks the sections to run (the copy bandwidth always runs: the others are read against
it). `--sweep` also times other tile/launch configurations of the named sections' kernels. Every
Triton output is checked against its baseline before it is timed; the JSON records the errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
from decode_pool import decode_pool  # bench/decode_pool.py: one pool build for every decode benchmark
from triton.testing import do_bench

from flotilla.kernels.activation import silu_and_mul_ref
from flotilla.kernels.layernorm import rms_norm_ref
from flotilla.kernels.linear import gemv_ref
from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref
from flotilla.kernels.triton_activation import silu_and_mul
from flotilla.kernels.triton_gemv import default_config, gemv
from flotilla.kernels.triton_kv_write import write_kv_cache
from flotilla.kernels.triton_paged_decode import default_num_splits, paged_decode_attention
from flotilla.kernels.triton_paged_prefill import paged_prefill_attention
from flotilla.kernels.triton_rmsnorm import rms_norm
from flotilla.kernels.triton_rotary import apply_rotary
from flotilla.kernels.triton_split_merge import merge_splits

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DEV = torch.device("cuda")
L2_ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
DECODE_BATCHES, DECODE_CTX = (1, 16, 64, 256), 4096
PREFILL = (8, 2048)  # batch, tokens
EXTEND = (8, 512, 1536)  # batch, new tokens, cached tokens
ELEMENTWISE = (8192, 4096)  # tokens, hidden
COPY_ELEMENTS = 2**29  # 1 GiB of bf16
# Llama-3.1-8B's projections (N, K), one layer's weight each; decode at M rows.
GEMV_SHAPES = {
    "qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336),
}  # fmt: skip
GEMV_ROWS = (1, 4)
GEMV_GRAPH_BYTES = 4 * 2**30  # weight bytes streamed per graph replay (~1 ms at copy rate)
SECTIONS = ("decode", "prefill", "elementwise", "gemv")
DEFAULT_SECTIONS = "decode,prefill,elementwise"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64."""
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def bench_ms(fn: Callable[[], object], repeats: int = 3) -> float:
    """Median ms of `fn` with do_bench (it flushes L2 between calls); the median of `repeats` such
    medians, since one do_bench of a ~60 us kernel was seen to vary by up to 20% between calls."""
    return statistics.median(float(do_bench(fn, warmup=25, rep=200, return_mode="median")) for _ in range(repeats))


def graph_ms(fn: Callable[[int], object], calls: int, replays: int = 15, iters: int = 1,
             stat: Callable[[list[float]], float] = statistics.median) -> float:
    """ms per call of `calls` invocations `fn(0..calls-1)` captured in one CUDA graph: `stat` (the median, or e.g.
    `min`) of `replays` timings, each of `iters` back-to-back replays between two CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / (iters * calls))
    del graph
    return stat(times)


def copy_bandwidth() -> dict:
    """GB/s of a 1 GiB copy, read + write counted."""
    src = torch.randn(COPY_ELEMENTS, device=DEV, dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return {"bytes": 2 * src.nbytes, "ms": ms, "gbps": 2 * src.nbytes / ms / 1e6}


# ---------------------------------------------------------------------------------------------
# decode


def decode_case(batch: int, ctx: int, sets: int) -> dict:
    """`sets` independent K/V sets for one decode shape: the paged pool with shuffled block tables,
    and the same K/V gathered contiguous `[B, Hkv, ctx, D]` for SDPA."""
    pool = decode_pool(batch, ctx, sets)
    k_cache, v_cache, tables = pool["k"], pool["v"], pool["tables"]

    def contiguous(cache: torch.Tensor, s: int) -> torch.Tensor:
        return cache[tables[s].long()].reshape(batch, ctx, KV_HEADS, HEAD_DIM).transpose(1, 2).contiguous()

    k_flat = [contiguous(k_cache, s) for s in range(sets)]
    v_flat = [contiguous(v_cache, s) for s in range(sets)]
    return {
        "k_cache": k_cache, "v_cache": v_cache, "tables": tables, "query": pool["q"], "qsl": pool["qsl"],
        "lens": pool["lens"], "k_flat": k_flat, "v_flat": v_flat, "batch": batch, "ctx": ctx, "sets": sets,
    }  # fmt: skip


def expand_kv(kv: torch.Tensor) -> torch.Tensor:
    """`[B, Hkv, N, D]` -> `[B, H, N, D]`: each KV head repeated for its query heads (no GQA needed)."""
    return kv.repeat_interleave(HEADS // KV_HEADS, dim=1)


def merge_only(batch: int, splits: int) -> Callable[[int], object]:
    """Launches of the split-merge kernel alone, on fixed partial results (a time breakdown)."""
    part_out = torch.randn(batch * HEADS * splits, HEAD_DIM, device=DEV)
    part_lse = torch.randn(batch * HEADS * splits, device=DEV)
    qsl = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
    out = torch.empty(batch, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    return lambda i: merge_splits(part_out, part_lse, qsl, out, batch, splits, rows_are_seqs=True)


def bench_decode(batch: int, ctx: int, sweep: bool) -> dict:
    """Paged Triton decode vs SDPA on contiguous K/V, GB/s of K+V read."""
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * 2
    sets = max(1, -(-L2_ROTATION_BYTES // kv_bytes)) if batch <= 16 else 1
    c = decode_case(batch, ctx, sets)
    scale = HEAD_DIM**-0.5
    graphed = batch <= 16
    calls = 200 if batch == 1 else 40

    def triton_fn(**cfg) -> Callable[[int], torch.Tensor]:
        return lambda i: paged_decode_attention(
            c["query"][i % sets], c["k_cache"], c["v_cache"], c["tables"][i % sets], c["qsl"], c["lens"],
            scale, **cfg,
        )  # fmt: skip

    def sdpa_fn(i: int) -> torch.Tensor:  # GQA inside SDPA, K/V read once per KV head
        q = c["query"][i % sets].unsqueeze(2)  # [B, H, 1, D]
        return F.scaled_dot_product_attention(
            q, c["k_flat"][i % sets], c["v_flat"][i % sets], scale=scale, enable_gqa=True
        )

    def time_it(fn: Callable[[int], object]) -> float:
        return graph_ms(fn, calls) if graphed else bench_ms(lambda: fn(0))

    ref = sdpa_fn(0).squeeze(2)
    result = {"batch": batch, "ctx": ctx, "kv_bytes": kv_bytes, "kv_sets": sets}
    result["timing"] = f"cuda graph of {calls} calls" if graphed else "do_bench median"
    err = rel_err(triton_fn()(0), ref)
    ms = time_it(triton_fn())
    sdpa = {"gqa": time_it(sdpa_fn)}
    # SDPA's fastest kernels may not take GQA: also time it on K/V expanded to every query head
    # (it then reads 4x the bytes; GB/s still counts the 8-head K/V). The faster is the baseline.
    k_rep = [expand_kv(t) for t in c["k_flat"]]
    v_rep = [expand_kv(t) for t in c["v_flat"]]
    sdpa_rep = lambda i: F.scaled_dot_product_attention(  # noqa: E731
        c["query"][i % sets].unsqueeze(2), k_rep[i % sets], v_rep[i % sets], scale=scale
    )
    result["rel_err_sdpa_expanded"] = rel_err(sdpa_rep(0).squeeze(2), ref)
    sdpa["expanded"] = time_it(sdpa_rep)
    sdpa_ms = min(sdpa.values())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = default_num_splits(batch, KV_HEADS, ctx, sms, 64)
    result.update(
        triton_ms=ms, triton_gbps=kv_bytes / ms / 1e6, rel_err_vs_sdpa=err, default_num_splits=splits,
        sdpa_ms_by_variant=sdpa, sdpa_ms=sdpa_ms, sdpa_gbps=kv_bytes / sdpa_ms / 1e6, ratio=sdpa_ms / ms,
    )  # fmt: skip
    if graphed and splits > 1:  # where the time goes: the merge kernel alone, on ready partials
        result["merge_kernel_ms"] = time_it(merge_only(batch, splits))
    if graphed and sets > 1:  # for comparison with anchors timed on one K/V set: L2-warm replays
        warm = {"triton": graph_ms(lambda i: triton_fn()(0), calls), "sdpa_gqa": graph_ms(lambda i: sdpa_fn(0), calls)}
        result["l2_warm_one_set_gbps"] = {name: kv_bytes / t / 1e6 for name, t in warm.items()}
    if sweep:
        # Tiles and warps at the default split count, then split counts at the default tiles (up to
        # 16 programs per SM: beyond that the partials cost more than the parallelism gives).
        configs = [{"block_n": bn, "num_warps": 4, "num_stages": 2} for bn in (32, 128)]
        configs += [{"block_n": 64, "num_warps": w, "num_stages": st} for w, st in ((8, 2), (4, 3))]
        configs += [
            {"num_splits": n}
            for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
            if n != splits and batch * KV_HEADS * n <= 16 * sms and n * 64 <= ctx
        ]
        result["sweep"] = []
        for cfg in configs:
            try:
                e = rel_err(triton_fn(**cfg)(0), ref)
                t = time_it(triton_fn(**cfg))
                result["sweep"].append({**cfg, "ms": t, "gbps": kv_bytes / t / 1e6, "rel_err": e})
            except Exception as exc:  # a config that does not compile (resources) is recorded, not fatal
                result["sweep"].append({**cfg, "error": repr(exc)[:200]})
    return result


# ---------------------------------------------------------------------------------------------
# prefill / extend


def bench_prefill(batch: int, new: int, cached: int, sweep: bool) -> dict:
    """Paged Triton prefill/extend vs SDPA on contiguous K/V (causal; `cached` prefix tokens)."""
    ctx = cached + new
    blocks_per_seq = ctx // PAGE
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, PAGE, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=DEV, dtype=torch.int32).view(batch, blocks_per_seq)
    query = torch.randn(batch * new, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    qsl = torch.arange(0, batch * new + 1, new, device=DEV, dtype=torch.int32)
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    k_flat = k_cache[tables.long()].reshape(batch, ctx, KV_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    v_flat = v_cache[tables.long()].reshape(batch, ctx, KV_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    q_flat = query.view(batch, new, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    # Useful work: each new token attends to `cached + its index + 1` keys.
    pairs = batch * HEADS * (new * cached + new * (new + 1) / 2)
    flops = 4 * HEAD_DIM * pairs

    def run(**cfg) -> torch.Tensor:
        return paged_prefill_attention(query, k_cache, v_cache, tables, qsl, lens, scale, **cfg)

    k_rep, v_rep = expand_kv(k_flat), expand_kv(v_flat)
    if cached == 0:
        kw = {"is_causal": True}
    else:  # bottom-right-aligned causal mask: new token j sees keys 0 ..= cached + j
        kw = {"attn_mask": torch.ones(new, ctx, device=DEV, dtype=torch.bool).tril(diagonal=cached)}
    variants = {  # GQA inside SDPA, or K/V expanded to every query head; the faster is the baseline
        "gqa": lambda: F.scaled_dot_product_attention(q_flat, k_flat, v_flat, scale=scale, enable_gqa=True, **kw),
        "expanded": lambda: F.scaled_dot_product_attention(q_flat, k_rep, v_rep, scale=scale, **kw),
    }  # fmt: skip
    ref = variants["gqa"]().transpose(1, 2).reshape(batch * new, HEADS, HEAD_DIM)
    result = {"batch": batch, "new_tokens": new, "cached_tokens": cached, "flops": flops}
    result["rel_err_vs_sdpa"] = rel_err(run(), ref)
    ms = bench_ms(run)
    sdpa = {name: bench_ms(fn) for name, fn in variants.items()}
    sdpa_ms = min(sdpa.values())
    result.update(
        triton_ms=ms, triton_tflops=flops / ms / 1e9, sdpa_ms_by_variant=sdpa, sdpa_ms=sdpa_ms,
        sdpa_tflops=flops / sdpa_ms / 1e9, ratio=sdpa_ms / ms,
    )  # fmt: skip
    if sweep:
        configs = [  # block_m, block_n, num_warps, num_stages, pack_heads
            (128, 64, 8, 3, True), (128, 128, 8, 2, True), (128, 32, 4, 2, True), (128, 32, 4, 4, True),
            (128, 32, 8, 3, True), (64, 32, 4, 3, True), (128, 32, 4, 3, False),
        ]  # fmt: skip
        result["sweep"] = []
        for bm, bn, w, st, pack in configs:
            cfg = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st, "pack_heads": pack}
            try:
                e = rel_err(run(**cfg), ref)
                t = bench_ms(lambda cfg=cfg: run(**cfg))
                result["sweep"].append({**cfg, "ms": t, "tflops": flops / t / 1e9, "rel_err": e})
            except Exception as exc:
                result["sweep"].append({**cfg, "error": repr(exc)[:200]})
    return result


# ---------------------------------------------------------------------------------------------
# fused element-wise kernels


SWEEP_WARPS = (4, 8, 16)


def _elementwise_case(name: str, nbytes: int, fn, eager, err: float, sweep: bool) -> dict:
    """Time one fused kernel (and, sweeping, with each warp count) and its eager torch equivalent;
    GB/s of the bytes it must move. `fn(**launch_kwargs)` runs the kernel."""
    ms, eager_ms = bench_ms(fn), bench_ms(eager)
    result = {
        "name": name, "bytes": nbytes, "triton_ms": ms, "triton_gbps": nbytes / ms / 1e6, "eager_ms": eager_ms,
        "eager_gbps": nbytes / eager_ms / 1e6, "rel_err": err,
    }  # fmt: skip
    if sweep:
        result["sweep"] = [
            {"num_warps": w, "gbps": nbytes / bench_ms(lambda w=w: fn(num_warps=w)) / 1e6} for w in SWEEP_WARPS
        ]
    return result


def bench_rmsnorm(tokens: int, hidden: int, sweep: bool) -> dict:
    """RMSNorm + residual: reads x, residual, weight; writes out and the new residual."""
    x = torch.randn(tokens, hidden, device=DEV, dtype=DTYPE)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=DEV, dtype=DTYPE)
    err = rel_err(rms_norm(x, w, 1e-5, res)[0], rms_norm_ref(x, w, 1e-5, res)[0])
    return _elementwise_case(
        "rmsnorm_residual", 4 * x.nbytes + w.nbytes, lambda **kw: rms_norm(x, w, 1e-5, res, **kw),
        lambda: rms_norm_ref(x, w, 1e-5, res), err, sweep,
    )  # fmt: skip


def bench_rotary(tokens: int, hidden: int, sweep: bool) -> dict:
    """Rotary on `hidden`-wide queries (32 heads) and 8 KV heads: reads and writes both, plus cos/sin rows."""
    q = torch.randn(tokens, hidden // HEAD_DIM, HEAD_DIM, device=DEV, dtype=DTYPE)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    positions = torch.randint(0, 8192, (tokens,), device=DEV)
    inv = 1.0 / (500000 ** (torch.arange(0, HEAD_DIM, 2, device=DEV).float() / HEAD_DIM))
    freqs = torch.arange(8192, device=DEV).float()[:, None] * inv[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    err = rel_err(apply_rotary(positions, q, k, cache)[0], apply_rotary_ref(positions, q, k, cache)[0])
    nbytes = 2 * (q.nbytes + k.nbytes) + tokens * HEAD_DIM * 4 + positions.nbytes
    return _elementwise_case(
        "rotary", nbytes, lambda **kw: apply_rotary(positions, q, k, cache, **kw),
        lambda: apply_rotary_ref(positions, q, k, cache), err, sweep,
    )  # fmt: skip


def bench_silu_and_mul(tokens: int, hidden: int, sweep: bool) -> dict:
    """SiLU-and-mul `[T, 2 * hidden] -> [T, hidden]`."""
    gate_up = torch.randn(tokens, 2 * hidden, device=DEV, dtype=DTYPE)
    err = rel_err(silu_and_mul(gate_up), silu_and_mul_ref(gate_up))
    return _elementwise_case(
        "silu_and_mul", gate_up.nbytes * 3 // 2, lambda **kw: silu_and_mul(gate_up, **kw),
        lambda: silu_and_mul_ref(gate_up), err, sweep,
    )  # fmt: skip


def bench_kv_write(tokens: int, hidden: int, sweep: bool) -> dict:
    """K and V `hidden` wide each (32 KV heads x 128, an MHA model) into a pool of shuffled blocks."""
    heads = hidden // HEAD_DIM
    key = torch.randn(tokens, heads, HEAD_DIM, device=DEV, dtype=DTYPE)
    value = torch.randn_like(key)
    num_blocks = tokens // PAGE
    k_cache = torch.empty(num_blocks, PAGE, heads, HEAD_DIM, device=DEV, dtype=DTYPE)
    v_cache = torch.empty_like(k_cache)
    blocks = torch.randperm(num_blocks, device=DEV)
    slots = (blocks[:, None] * PAGE + torch.arange(PAGE, device=DEV)[None, :]).reshape(-1)
    write_kv_cache(key, value, k_cache, v_cache, slots)
    exact = torch.equal(k_cache.view(-1, heads, HEAD_DIM)[slots], key)
    exact &= torch.equal(v_cache.view(-1, heads, HEAD_DIM)[slots], value)
    nbytes = 4 * key.nbytes + slots.nbytes
    return _elementwise_case(
        "kv_write", nbytes, lambda **kw: write_kv_cache(key, value, k_cache, v_cache, slots, **kw),
        lambda: write_kv_cache_ref(key, value, k_cache, v_cache, slots), 0.0 if exact else 1.0, sweep,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# small-batch GEMV (decode-time linear layers)


def gemv_sweep_configs(m: int, n: int, k: int, sms: int) -> list[dict]:
    """At most ~45 configurations around the default: FMA tiles, warps x stages, split-K, and a few
    `tl.dot` (swap-AB) tiles. FMA tiles whose accumulator needs more than 128 fp32 registers a
    thread are left out (they spill)."""
    default = default_config(m, n, k, sms)
    block_m = triton.next_power_of_2(m)

    def fits(bn: int, bk: int, warps: int = 4) -> bool:
        return block_m * bn * bk <= 128 * 32 * warps

    configs = [
        {"use_dot": False, "block_n": bn, "block_k": bk}
        for bn in (8, 16, 32, 64)
        for bk in (128, 256, 512)
        if fits(bn, bk) and (bn, bk) != (default.block_n, default.block_k)
    ]
    tiles = {"use_dot": False, "block_n": default.block_n, "block_k": default.block_k}
    configs += [
        {**tiles, "num_warps": w, "num_stages": st}
        for w in (2, 4, 8)
        for st in (1, 2, 3, 4)
        if (w, st) != (default.num_warps, default.num_stages) and fits(default.block_n, default.block_k, w)
    ]
    configs += [{**tiles, "split_k": sk} for sk in (1, 2, 4, 8) if sk != default.split_k]
    configs += [
        {"use_dot": False, "block_n": bn, "block_k": 256, "split_k": sk}
        for bn in (16, 32)
        for sk in (2, 4)
        if fits(bn, 256)
    ]
    configs += [  # block_n, block_k, num_stages, split_k (None: the heuristic's), num_warps
        {"use_dot": True, "block_n": bn, "block_k": bk, "num_stages": st, "split_k": sk, "num_warps": w}
        for bn, bk, st, sk, w in (
            (64, 128, 4, None, 4), (64, 128, 3, None, 4), (64, 256, 3, None, 4), (32, 128, 4, None, 4),
            (16, 128, 4, None, 4), (16, 256, 4, None, 4), (64, 128, 4, 2, 4), (64, 128, 4, 4, 4),
            (128, 64, 4, None, 4), (64, 64, 4, None, 4), (64, 128, 4, None, 8),
        )
    ]  # fmt: skip
    return configs


def bench_gemv(name: str, n: int, k: int, m: int, copy_gbps: float, sweep: bool) -> dict:
    """Triton GEMV vs F.linear (cuBLAS) for a bf16 weight `[n, k]` and `m` rows: GB/s of weight read.

    Both are timed in one CUDA graph of many calls (decode runs under graphs), rotating over
    `sets` weight copies that together exceed the L2 several times, so every call streams its weight
    from HBM; the x and output bytes (a few KB) are not counted.
    """
    w_bytes = n * k * DTYPE.itemsize
    sets = max(3, -(-L2_ROTATION_BYTES // w_bytes))
    weights = [torch.randn(n, k, device=DEV, dtype=DTYPE).div_(k**0.5) for _ in range(sets)]
    xs = torch.randn(sets, m, k, device=DEV, dtype=DTYPE)
    calls = sets * max(1, round(GEMV_GRAPH_BYTES / (sets * w_bytes)))
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def triton_fn(**cfg) -> Callable[[int], torch.Tensor]:
        return lambda i: gemv(xs[i % sets], weights[i % sets], **cfg)

    def cublas_fn(i: int) -> torch.Tensor:
        return F.linear(xs[i % sets], weights[i % sets])

    ref = gemv_ref(xs[0], weights[0])

    def errors(out: torch.Tensor) -> dict:
        return {"rel_err": rel_err(out, ref), "max_abs_err": float((out.float() - ref.float()).abs().max())}

    def gbps(ms: float) -> float:
        return w_bytes / ms / 1e6

    result = {"name": name, "n": n, "k": k, "m": m, "weight_bytes": w_bytes, "weight_sets": sets}
    result["timing"] = f"cuda graph of {calls} calls"
    result["default_config"] = dataclasses.asdict(default_config(m, n, k, sms))
    result["cublas_errors"] = errors(cublas_fn(0))
    cublas_ms = graph_ms(cublas_fn, calls)
    result.update(cublas_ms=cublas_ms, cublas_gbps=gbps(cublas_ms), cublas_fraction_of_copy=gbps(cublas_ms) / copy_gbps)
    try:  # the kernel is new to the GPU: a default that fails to compile must not cost the sweep
        result["triton_errors"] = errors(triton_fn()(0))
        ms = graph_ms(triton_fn(), calls)
    except Exception as exc:
        result["triton_error"] = repr(exc)[:500]
        ms = float("inf")
    result.update(triton_ms=ms, triton_gbps=gbps(ms), ratio=cublas_ms / ms, fraction_of_copy=gbps(ms) / copy_gbps)
    if sweep:
        result["sweep"] = []
        for cfg in gemv_sweep_configs(m, n, k, sms):
            try:
                e = errors(triton_fn(**cfg)(0))
                t = graph_ms(triton_fn(**cfg), calls)
                result["sweep"].append({**cfg, "ms": t, "gbps": gbps(t), "ratio": cublas_ms / t, **e})
            except Exception as exc:  # a config that does not compile (resources) is recorded, not fatal
                result["sweep"].append({**cfg, "error": repr(exc)[:200]})
        timed = [s for s in result["sweep"] if "gbps" in s and s["rel_err"] < 2e-2]
        if timed:
            result["best"] = max(timed, key=lambda s: s["gbps"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument(
        "--sections",
        default=DEFAULT_SECTIONS,
        help=f"comma list of sections to run, of {','.join(SECTIONS)} or 'all' (default: {DEFAULT_SECTIONS})",
    )
    parser.add_argument(
        "--sweep",
        default="",
        help="comma list of sections (decode,prefill,elementwise,gemv) to time other configurations of",
    )
    parser.add_argument("--gemv-rows", type=lambda v: [int(x) for x in v.split(",")], default=list(GEMV_ROWS),
                        help="rows (M) of the gemv section, comma list (default: 1,4)")
    args = parser.parse_args()
    sections = set(SECTIONS) if args.sections == "all" else set(filter(None, args.sections.split(",")))
    if sections - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(sections - set(SECTIONS)))}")
    sweep = set(filter(None, args.sweep.split(",")))
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(sys.argv),
        "device": props.name, "sms": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__,
        "shapes": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "page": PAGE, "dtype": "bf16"},
    }  # fmt: skip

    def save() -> None:  # after every section, so a run cut short still leaves its numbers
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)

    results["copy"] = copy_bandwidth()
    print(f"copy {results['copy']['gbps']:.0f} GB/s", flush=True)
    copy = results["copy"]["gbps"]
    if "decode" in sections:
        results["decode"] = []
        for batch in DECODE_BATCHES:
            r = bench_decode(batch, DECODE_CTX, "decode" in sweep)
            results["decode"].append(r)
            gbps, sdpa, err = r["triton_gbps"], r["sdpa_gbps"], r["rel_err_vs_sdpa"]
            print(f"decode b{batch}: triton {gbps:.0f} GB/s, sdpa {sdpa:.0f}, err {err:.1e}", flush=True)
            save()
            torch.cuda.empty_cache()
    if "prefill" in sections:
        results["prefill"] = bench_prefill(PREFILL[0], PREFILL[1], 0, "prefill" in sweep)
        results["extend"] = bench_prefill(*EXTEND, False)
        for key in ("prefill", "extend"):
            r = results[key]
            tf, sdpa, err = r["triton_tflops"], r["sdpa_tflops"], r["rel_err_vs_sdpa"]
            print(f"{key}: triton {tf:.0f} TFLOP/s, sdpa {sdpa:.0f}, err {err:.1e}", flush=True)
        save()
    if "elementwise" in sections:
        results["elementwise"] = {}
        for case_fn in (bench_rmsnorm, bench_rotary, bench_silu_and_mul, bench_kv_write):
            r = case_fn(*ELEMENTWISE, "elementwise" in sweep)
            results["elementwise"][r.pop("name")] = r
            torch.cuda.empty_cache()
    if "gemv" in sections:
        results["gemv"] = []
        for m in args.gemv_rows:
            for name, (n, k) in GEMV_SHAPES.items():
                r = bench_gemv(name, n, k, m, copy, "gemv" in sweep)
                results["gemv"].append(r)
                err = f"{r['triton_errors']['rel_err']:.1e}" if "triton_errors" in r else r["triton_error"]
                print(
                    f"gemv {name} m{m}: triton {r['triton_gbps']:.0f} GB/s, cublas {r['cublas_gbps']:.0f}, err {err}",
                    flush=True,
                )
                save()
                torch.cuda.empty_cache()
    floors = {}
    for r in results.get("decode", []):
        if r["batch"] == 1:
            floors["decode_b1_gbps>=2000"] = r["triton_gbps"] >= 2000
        else:
            floors[f"decode_b{r['batch']}_ratio>=0.8"] = r["ratio"] >= 0.8
    if "prefill" in results:
        floors["prefill_ratio>=0.6"] = results["prefill"]["ratio"] >= 0.6
    for name, r in results.get("elementwise", {}).items():
        r["fraction_of_copy"] = r["triton_gbps"] / copy
        floors[f"{name}>=0.7copy"] = r["fraction_of_copy"] >= 0.7
    for r in results.get("gemv", []):
        floors[f"gemv_{r['name']}_m{r['m']}>=0.9copy"] = r["fraction_of_copy"] >= 0.9
    results["floors_met"] = floors
    save()
    print("\n| case | Triton | baseline | ratio | floor met |")
    for r in results.get("decode", []):
        key = "decode_b1_gbps>=2000" if r["batch"] == 1 else f"decode_b{r['batch']}_ratio>=0.8"
        case = f"decode b{r['batch']}x{r['ctx']} GB/s"
        print(f"| {case} | {r['triton_gbps']:.0f} | SDPA {r['sdpa_gbps']:.0f} | {r['ratio']:.2f} | {floors[key]} |")
    for key in ("prefill", "extend") if "prefill" in results else ():
        r = results[key]
        met = floors.get("prefill_ratio>=0.6", "") if key == "prefill" else "-"
        print(f"| {key} TFLOP/s | {r['triton_tflops']:.0f} | SDPA {r['sdpa_tflops']:.0f} | {r['ratio']:.2f} | {met} |")
    for name, r in results.get("elementwise", {}).items():
        met = floors[name + ">=0.7copy"]
        print(f"| {name} GB/s | {r['triton_gbps']:.0f} | copy {copy:.0f} | {r['fraction_of_copy']:.2f} | {met} |")
    for r in results.get("gemv", []):  # ratio: cuBLAS time / Triton time; the floor: >= 0.9 of copy
        met = floors[f"gemv_{r['name']}_m{r['m']}>=0.9copy"]
        case = f"gemv {r['name']} m{r['m']} GB/s ({r['fraction_of_copy']:.2f} copy)"
        print(f"| {case} | {r['triton_gbps']:.0f} | cuBLAS {r['cublas_gbps']:.0f} | {r['ratio']:.2f} | {met} |")
    for r in results.get("decode", []):
        if "sweep" in r:
            best = max((s for s in r["sweep"] if "gbps" in s), key=lambda s: s["gbps"])
            print(f"sweep decode b{r['batch']}: best {best}")
    if "sweep" in results.get("prefill", {}):
        for s in results["prefill"]["sweep"]:
            print(f"sweep prefill: {s}")
    for name, r in results.get("elementwise", {}).items():
        if "sweep" in r:
            print(f"sweep {name}: " + ", ".join(f"{s['num_warps']} warps {s['gbps']:.0f}" for s in r["sweep"]))
    for r in results.get("gemv", []):
        if "best" in r:
            b = r["best"]
            knobs = ("use_dot", "block_n", "block_k", "split_k", "num_warps", "num_stages")
            cfg = {key: b[key] for key in knobs if key in b}
            print(f"sweep gemv {r['name']} m{r['m']}: best {b['gbps']:.0f} GB/s, x{b['ratio']:.2f} cuBLAS, {cfg}")


if __name__ == "__main__":
    main()

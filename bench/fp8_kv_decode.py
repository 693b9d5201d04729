"""Paged decode attention on an fp8 KV pool against a bf16 one, H200 (issue 22: fp8 KV must make the
batch-64 x 4,096 decode step faster, it made it 1.14x slower on 2026-12-03).

    python3 bench/fp8_kv_decode.py --json fp8-kv-decode.json [--batches 64,1] [--ctx 4096] [--best-fp8-launch F]

Llama-3.1-8B's attention (32 query heads, 8 KV heads, head dim 128, pages of 16 tokens), block tables
shuffled over a pool larger than the L2. For each row of `cases` (pool, fp8 operand path, launch) it times
`paged_decode_attention` on the bf16 pool or on the same values in fp8 (e4m3), in CUDA graphs of many
calls, and reports GB/s of K+V bytes read (each pool's own bytes). fp8 operand paths (`fp8_kv`, see
kernels/triton_paged_decode.py): `asm` the bit moves to fp16 in PTX (ten instructions for four values, V
kept in its load layout by a select; the default of 2026-12-04 s6), `cvt16` the hardware e4m3 -> fp16 cvt
(same select), `perm` seven bit-move instructions for four values and `cvtpx` the hardware cvt in PTX, both
with V kept in its load layout by an impure asm (no select), `perm_k` / `cvtpx_k` K kept in its load layout too;
`key_streams` rows run the loop as a batched dot over interleaved key streams (one a warp: no cross-warp softmax
reductions, the query's fragments in registers).
At batch 1 it varies the splits and launches the merge kernel plainly or by programmatic dependent launch.
Each output is checked against the bf16 result on the fp8-rounded pool (rel err printed); the bf16
pool's error is its distance from that rounding.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from compile_workers import compile_in_workers  # bench/compile_workers.py
from decode_pool import HEAD_DIM, KV_HEADS, PAGE, decode_pool, l2_sets  # bench/decode_pool.py


def _launch(block_n: int, warps: int, stages: int, **more) -> dict:
    return {"block_n": block_n, "num_warps": warps, "num_stages": stages, **more}


def _b1(block_n: int, warps: int, stages: int, splits: int | None, merge: str, **more) -> dict:
    """A batch-1 launch: `splits` splits of the context, merged by the merge kernel ("kernel"), by it launched
    by programmatic dependent launch ("pdl") or by the last split program of each KV head ("fused"); "+early":
    the split kernel itself launched by PDL (it reads lengths and pages, and prefetches, while the previous
    call's kernels finish: in this graph of back-to-back calls, the best case of the engine's chain), "+prefetch":
    each split program asks L2 for all of its keys and values up front."""
    merge, *flags = merge.split("+")
    if flags:
        more |= {"early_start": "early" in flags, "prefetch": "prefetch" in flags}
    if "dyn" in flags:  # each length cut into equal page ranges in the kernel (`dynamic_splits`)
        more |= {"dynamic_splits": True}
    return _launch(block_n, warps, stages, num_splits=splits, fused_merge=merge == "fused", pdl_merge=merge == "pdl",
                   **more)  # fmt: skip


# Batch-1 rows (splits, block_n, warps, stages, merge); each split holds 4,096 / splits keys. Session 10's grid (call 5:
# every merge over 16-128 splits, chunked merges, 8-warp tiles, the fp8 pool) is in `git log -p`. attn11's fused rows,
# the first seven also with "+early":
B1_FUSED = ((32, 32, 4, 3, "fused"), (32, 64, 4, 2, "fused"), (32, 64, 4, 3, "fused"), (64, 64, 4, 2, "fused"),
            (64, 32, 4, 3, "fused"), (128, 32, 4, 2, "fused"), (16, 64, 4, 3, "fused"), (32, 32, 4, 4, "fused"),
            (128, 64, 4, 2, "fused"), (64, 32, 4, 2, "fused"),
            # deep: every tile of a split in flight at once (16 splits = 128 programs, one an SM, 4 tiles of 64 keys)
            (16, 64, 4, 5, "fused"), (16, 64, 4, 4, "fused"), (32, 32, 4, 5, "fused"))
ENGINE_TABLE = 4288  # bench/decode_ab.py's table at context 4,096 (max_model_len 4,096 + 4 x 32 steps + 64)
ENGINE_CTX = 4160  # ... and a length in its timed steps (4,097-4,224): a split count that divides 4,096 gets one more
WIDE = 16384  # a batch-1 row's block table sized for this many tokens (the engine's graph buckets: 4,096, 16,384)


def cases(batch: int, grid: str = "kv15") -> list[tuple[str, str | None, dict]]:
    """(pool, fp8_kv, launch) rows. Batch 64 (512 programs at one split): the bf16 pool at its default, the fp8
    plain loop (cvtpx, perm 64/4/3) and around 2026-12-04 s7 call 4's fastest, one key stream a warp at 32/2/4
    (146.3 us): depth, 2- and 4-warp tiles. Batch 1 (issue 19: >= 2,000 GB/s, <= 8.4 us; s7's best 11.16 us at
    128 splits of 32 keys with the merge by PDL): the default, then the reworked fused merge (kv10), the merge by
    PDL and the plain merge kernel over split counts x keys per tile x warps; then the context in a table sized for
    `WIDE` tokens (the engine's graphs pad the table to a bucket: the general launch's splits then stretch over
    the padding, a small launch's `split_tokens` keep their size); then the fp8 pool. Earlier lists
    (`git log -p bench/fp8_kv_decode.py`): call 2 (kv7 @250e64f) the s6 asm and cvt16 paths, perm_k / cvtpx_k,
    64/8 tiles; call 4 (@d97ebf7) also one batched stream (key_streams 1: 268 us) and a 128-register cap
    (maxnreg: 201-1,577 us), both dropped."""
    if batch > 1:
        return batch64_rows(grid)
    # attn11 (session 11): the fused merge in one online pass (`_merge_group`), so more splits no longer pay two L2
    # round trips a chunk. First the engine's conditions (pool "bf16_engine": bench/decode_ab.py's 4,288-token table
    # at a context of 4,160, where a split count that divides 4,096 gets one split more): the default, every fused
    # launch whose arithmetic equals the default's at a context of one 64-key tile (64-key tiles, 4 warps: the greedy
    # tokens then compare equal numbers; SAFE_LAUNCH, the engine sides' launch, is the fastest of them), some cut
    # by "+dyn" (4,160 keys into 16 or 32 equal page ranges, not 17 or 33), s10 call 5's best (32-key tiles) and
    # merge chunks of 16. Then issue 19's metric (pool "bf16": context 4,096 in a
    # 4,096-token table): the default, fused over 16-128 splits (s10's best first), "+early", the prefetch, the
    # merge by PDL; then a 16,384-token table (a server's graph bucket).
    safe = [(sp, b, w, st, m) for sp, b, w, st, m in B1_FUSED if b >= 64 and w == 4]
    rows = [("bf16", None, {"table": ENGINE_TABLE})]
    rows += [("bf16", None, _b1(b, w, st, None, m, split_tokens=4096 // sp, table=ENGINE_TABLE))
             for sp, b, w, st, m in safe]  # fmt: skip
    rows += [("bf16", None, _b1(b, w, st, None, m + "+early", split_tokens=4096 // sp, table=ENGINE_TABLE))
             for sp, b, w, st, m in safe[:4] + [(16, 64, 4, 5, "fused")]]  # fmt: skip
    rows += [("bf16", None, _b1(b, w, st, None, m, split_tokens=4096 // sp, table=ENGINE_TABLE))
             for sp, b, w, st, m in ((16, 64, 4, 3, "fused+dyn"), (16, 64, 4, 5, "fused+dyn"),
                                     (16, 64, 4, 4, "fused+dyn"), (32, 64, 4, 2, "fused+dyn"),
                                     (32, 64, 4, 3, "fused+dyn"), (16, 64, 4, 5, "fused+early+dyn"))]  # fmt: skip
    rows += [("bf16", None, _b1(32, 4, 3, None, "fused", split_tokens=128, table=ENGINE_TABLE))]
    # 34 splits pad to 64: the merge in chunks of 8 by default (`_merge_chunk`), here 16
    rows += [("bf16", None, _b1(64, 4, 3, None, "fused", split_tokens=128, table=ENGINE_TABLE, merge_chunk=16))]
    rows += [("bf16", None, {})]
    rows += [("bf16", None, _b1(b, w, st, sp, m)) for sp, b, w, st, m in B1_FUSED]
    rows += [("bf16", None, _b1(b, w, st, sp, m + "+early")) for sp, b, w, st, m in B1_FUSED[:7]]
    rows += [("bf16", None, _b1(b, w, st, sp, "fused+early+prefetch")) for sp, b, w, st in ((32, 64, 4, 3),
                                                                                          (64, 64, 4, 2))]
    rows += [("bf16", None, _b1(16, 64, 4, 5, "fused+early"))]
    rows += [("bf16", None, _b1(b, w, st, sp, "pdl+early")) for sp, b, w, st in ((64, 64, 4, 2), (128, 32, 4, 2))]
    rows += [("bf16", None, {"table": WIDE})]
    rows += [("bf16", None, _b1(b, w, st, None, "fused", split_tokens=128, table=WIDE)) for b, w, st in ((64, 4, 3),
                                                                                                      (32, 4, 3))]
    return rows


# kv15 (session 15): main's fp8 default (form t, 32/2/4, 1 split: 134.7 us in s11 call 4), then the rows the earlier
# sweeps left out, likeliest first (a cut sweep keeps its rows). Session 11's grid (t at 2 and 4 splits, h over 2-8
# heads at 4 splits with the merge kernel) is in `git log -p`. "h2" (`_attend_heads_t` with KS = 2): a 4-warp program
# covers 2 neighbouring KV heads, 2 interleaved 16-key streams a head (per warp the arithmetic of main's t 32/2), so
# one split is 256 programs of 4 warps: main's 8 warps an SM, but a key's two heads (256 contiguous bytes, as a bf16
# head) asked for by one program in one iteration. Tuples: (form, block_n, warps, stages, splits); streams = warps.
# Triton 3.6 sm_90 (bench/sass_loop.py): h2 32/4 297 loop instructions (t 32/2: 301), 130 registers, 16 KB a stage
# (2 programs an SM fit 6 stages); h2 64/4/3 (32-key streams) 560 for twice the keys, 183 registers; h2 64/8/2
# (4 streams a head) 290, 128; h4 32/8/4 (4 heads, 128 programs) 298, 128, 128 KB. A 2-split h2 32/4 would need
# <= 128 registers for 4 programs an SM (it takes 130-132: two waves), so h2 runs at one split.
KV15_GRID = (("h2", 32, 4, 4, 1), ("h2", 32, 4, 6, 1), ("h2", 32, 4, 3, 1), ("h2", 32, 4, 5, 1), ("t", 32, 2, 6, 1),
             ("t", 32, 2, 5, 1), ("h2", 64, 4, 3, 1), ("h2", 64, 8, 2, 1), ("h4", 32, 8, 4, 1), ("h", 16, 2, 3, 2),
             ("h", 32, 2, 3, 2))  # fmt: skip
MAIN_FP8 = ("t", 32, 2, 4, 1)
# Pages in order (each sequence's pages consecutive in the pool, as a fresh engine's free queue hands them out)
# instead of shuffled: main's default and the first two new rows.
KV15_SEQUENTIAL = (MAIN_FP8, ("h2", 32, 4, 4, 1), ("h2", 32, 4, 6, 1))


# Session 24 (kvfp8, `--grid kvfp8`): the fp8 pool's default since session 16 (h2 32/4/3, one split), then
# `_attend_heads_t`'s LEAN loop (FLOTILLA_DECODE_FP8_LEAN: full tiles unmasked, a 32-key stream's pages a page at a
# time, a pointer a page and 32-bit offsets in it), the last field. Triton 3.6 sm_90 (bench/sass_loop.py, the loop
# over full tiles; registers): h2 32/4 297 -> 269 instructions (130 -> 128), h2 64/4 560 -> 431 (183 -> 176): 18.6
# -> 16.8 / 13.5 warp instructions a (key, KV head); the bf16 pool's 64/4/2 loop is 27.1 for twice the bytes. h2
# 64/4 at 4 stages would take 128 KB of shared memory (one program an SM: two waves), so 2 and 3; h4 64/8 (247
# registers, 128 programs: one an SM) at 2 and 3. Lean h2 32/4/3 takes 128 registers (the masked loop 130-132) and
# 48 KB, so 4 programs fit an SM: 2 splits (512 programs, 16 warps an SM, the merge kernel) in one wave.
KVFP8_MAIN = ("h2", 32, 4, 3, 1)
KVFP8_GRID = (("h2", 32, 4, 3, 1, True), ("h2", 64, 4, 3, 1, False), ("h2", 64, 4, 3, 1, True),
              ("h2", 64, 4, 2, 1, True), ("h2", 32, 4, 4, 1, True), ("h2", 32, 4, 3, 2, True),
              ("h2", 64, 8, 2, 1, True), ("h4", 64, 8, 3, 1, True), ("h4", 64, 8, 2, 1, True))  # fmt: skip
KVFP8_SEQUENTIAL = (KVFP8_MAIN, ("h2", 32, 4, 3, 1, True), ("h2", 64, 4, 3, 1, True))


# Session 30 (kv30, `--grid kv30`): warps an SM. Triton 3.6 sm_90 (bench/sass_loop.py, as the engine launches them at
# batch 64 x 4,096 on 132 SMs; registers, shared memory): the bf16 pool's 64/4/2 takes 128 and 38 KB, so its 512
# programs run 4 an SM in one wave, 16 warps an SM; the fp8 default (lean h2 64/4/3) takes 176 and 96 KB, so its 256
# programs run 2 an SM, 8 warps an SM, each warp's loop a latency chain (cp.async wait -> byte LDS -> F2FP -> STS ->
# CTA barrier -> LDSM -> 16 HMMA -> shuffles -> exp2 -> 16 HMMA): half the bf16 kernel's warps to hide latency, for
# twice the keys a byte. Rows that keep the default's bytes in flight (2 x 2 K+V tiles of 32 KB ahead an SM, or
# 4 x 2 of 16 KB) with more warps or more independent programs an SM: h2 64/8/3 (4 streams of 16 keys a head: 128,
# 96 KB: 2 programs = 16 warps an SM), h1 64/4/3 (one KV head a program, 4 streams of 16: 128, 48 KB: 4 programs =
# 16 warps an SM, 512 in one wave at FLOTILLA_DECODE_WAVE=4), h1 64/2/3 (2 streams of 32: 176, 48 KB: 4 programs,
# 8 warps), h1 32/2/4 and 32/2/3 (132, 32 / 24 KB), h2 64/8/3 with the masked loop; the default again last (drift),
# then the default and h2 64/8/3 on a table of consecutive pages. (h1 64/2/2 spills: 168 registers, 8 bytes of
# stack.) Fields as KVFP8_GRID's (form, block_n, warps, stages, splits, lean).
KV30_MAIN = ("h2", 64, 4, 3, 1, True)
KV30_GRID = (("h2", 64, 8, 3, 1, True), ("h1", 64, 4, 3, 1, True), ("h1", 64, 2, 3, 1, True), ("h1", 32, 2, 4, 1, True),
             ("h1", 32, 2, 3, 1, True), ("h2", 64, 8, 3, 1, False), KV30_MAIN)  # fmt: skip
KV30_SEQUENTIAL = (KV30_MAIN, ("h2", 64, 8, 3, 1, True))


def _fp8_row(form: str, block_n: int, warps: int, stages: int, splits: int, lean: bool | None = None,
             **more) -> tuple[str, str, dict]:  # fmt: skip
    """An fp8 (cvtpx) row, one key stream a warp; `lean` True / False runs `paged_decode_attention`'s lean loop or the
    masked one, None (rows of five fields) the pool's default (FLOTILLA_DECODE_FP8_LEAN: on since session 25)."""
    more |= {} if lean is None else {"lean": lean}
    return ("fp8", "cvtpx", _launch(block_n, warps, stages, key_streams=warps, form=form, num_splits=splits, **more))


def batch64_rows(grid: str = "kv15") -> list[tuple[str, str | None, dict]]:
    """The batch-64 rows: the bf16 pool at its default, main's fp8 default (the baseline), `KV15_GRID`, then
    `KV15_SEQUENTIAL` on a table of consecutive pages; `grid` "kvfp8": the same with `KVFP8_*`, "kv30" with `KV30_*`."""
    if grid == "kv30":
        rows = [("bf16", None, {}), _fp8_row(*KV30_MAIN)] + [_fp8_row(*g) for g in KV30_GRID]
        return rows + [("bf16", None, {"table": "seq"})] + [_fp8_row(*g, table="seq") for g in KV30_SEQUENTIAL]
    if grid == "kvfp8":
        rows: list[tuple[str, str | None, dict]] = [("bf16", None, {}), _fp8_row(*KVFP8_MAIN)]
        rows += [_fp8_row(*g) for g in KVFP8_GRID]
        rows += [("bf16", None, {"table": "seq"})]
        return rows + [_fp8_row(*g, table="seq") for g in KVFP8_SEQUENTIAL]
    rows = [("bf16", None, {}), _fp8_row(*MAIN_FP8)]
    rows += [_fp8_row(*g) for g in KV15_GRID]
    rows += [("bf16", None, {"table": "seq"})]
    rows += [_fp8_row(*g, table="seq") for g in KV15_SEQUENTIAL]
    return rows


def small_launch(row: dict) -> str:
    """A batch-1 row's launch as FLOTILLA_DECODE_SMALL_LAUNCH reads it (block_n,warps,stages,split_tokens,merge
    [,merge_chunk]), the split count as keys per split of the row's context."""
    merge = "fused" if row.get("fused_merge") else "pdl" if row.get("pdl_merge") else "kernel"
    merge += "+early" if row.get("early_start") else ""
    merge += "+prefetch" if row.get("prefetch") else ""
    merge += "+dyn" if row.get("dynamic_splits") else ""
    tokens = row.get("split_tokens") or row["ctx"] // row["num_splits"]
    chunk = f",{row['merge_chunk']}" if row.get("merge_chunk") else ""
    return f"{row['block_n']},{row['num_warps']},{row['num_stages']},{tokens},{merge}{chunk}"


def bench_batch(batch: int, ctx: int, results: dict, path: Path, part: tuple[int, int] | None = None,
                grid: str = "kv15") -> None:  # fmt: skip
    """Every configuration on the bf16 pool and on the same values in fp8, each fp8 operand path. `part` (i, n):
    only compile rows i, i + n, ... (one call each on a small pool; `--workers`), no timing."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from kernels import graph_ms  # bench/kernels.py

    sets = 1 if part else l2_sets(batch, ctx)
    pool = decode_pool(batch, ctx, sets)
    k16, v16, tables, qsl, lens = pool["k"], pool["v"], pool["tables"], pool["qsl"], pool["lens"]
    pools = {"bf16": (k16, v16), "fp8": (k16.to(torch.float8_e4m3fn), v16.to(torch.float8_e4m3fn))}
    wides = {"seq": torch.arange(tables.numel(), device="cuda", dtype=torch.int32).view(tables.shape)}
    for width in {WIDE, ENGINE_TABLE}:
        wides[width] = torch.zeros(sets, batch, max(width // PAGE, tables.shape[2]), device="cuda", dtype=torch.int32)
        wides[width][:, :, : tables.shape[2]] = tables  # the same pages; the rest of the row is never read...
    extra = ENGINE_CTX // PAGE - tables.shape[2]  # ... but for the engine-like rows' context: pages of the next set
    if batch == 1 and extra > 0:
        wides[ENGINE_TABLE][:, :, tables.shape[2] : tables.shape[2] + extra] = tables.roll(1, 0)[:, :, :extra]
    queries = {"bf16": pool["q"]}
    k8, v8 = pools["fp8"]
    ref = paged_decode_attention(queries["bf16"][0], k8.to(torch.bfloat16), v8.to(torch.bfloat16), tables[0], qsl,
                                 lens, HEAD_DIM**-0.5).float()  # fmt: skip
    ref_seq = paged_decode_attention(queries["bf16"][0], k8.to(torch.bfloat16), v8.to(torch.bfloat16), wides["seq"][0],
                                     qsl, lens, HEAD_DIM**-0.5).float()  # fmt: skip
    lens_engine = torch.full((batch,), ENGINE_CTX, device="cuda", dtype=torch.int32)
    ref_engine = paged_decode_attention(queries["bf16"][0], k8.to(torch.bfloat16), v8.to(torch.bfloat16),
                                        wides[ENGINE_TABLE][0], qsl, lens_engine, HEAD_DIM**-0.5).float()  # fmt: skip
    calls = 20 if batch >= 16 else 100

    def attend(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: dict):
        width = cfg.pop("table", None)
        table = wides[width] if width else tables
        seq_lens = lens_engine if width == ENGINE_TABLE else lens
        return lambda i: paged_decode_attention(query[i % sets], k, v, table[i % sets], qsl, seq_lens, HEAD_DIM**-0.5,
                                                **cfg)  # fmt: skip

    for index, (pool, mode, cfg) in enumerate(cases(batch, grid)):
        if part and index % part[1] != part[0]:
            continue
        k, v = pools[pool]
        fn = attend(queries["bf16"], k, v, cfg | ({"fp8_kv": mode} if mode else {}))
        if part:
            try:
                fn(0)
            except Exception as exc:  # the timing process records it
                print(f"compile {pool} {mode} {cfg}: {repr(exc)[:160]}", flush=True)
            continue
        engine = cfg.get("table") == ENGINE_TABLE
        context, want = (ENGINE_CTX, ref_engine) if engine else (ctx, ref_seq if cfg.get("table") == "seq" else ref)
        nbytes = 2 * batch * context * KV_HEADS * HEAD_DIM * k.element_size()
        suffix = {WIDE: "_wide", ENGINE_TABLE: "_engine", "seq": "_seq"}.get(cfg.get("table"), "")
        name = (pool if pool == "bf16" else f"fp8_{mode}") + suffix
        row: dict = {"batch": batch, "ctx": context, "pool": name, **cfg}
        try:
            err = ((fn(0).float() - want).norm() / want.norm()).item()
            ms = graph_ms(fn, calls)
            after = ((fn(0).float() - want).norm() / want.norm()).item()  # the fused merge's tickets reset every call
            row.update(us=1e3 * ms, gbps=nbytes / ms / 1e6, rel_err=err, rel_err_after=after)
        except Exception as exc:  # a configuration that does not compile is recorded
            row["error"] = repr(exc)[:200]
        results["cases"].append(row)
        print(" ", {x: row[x] for x in row if x not in ("batch", "ctx")}, flush=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    if part:
        torch.cuda.synchronize()
        return
    for line in summarize(results, batch):
        print(line, flush=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def summarize(results: dict, batch: int) -> list[str]:
    """Per pool at `batch`: the default row (the first) and the fastest, into results["best"]; at batch 1 the
    fastest bf16 launch as FLOTILLA_DECODE_SMALL_LAUNCH reads it (results["small_launch"]), when it is not the
    default row."""
    lines = []
    for pool in dict.fromkeys(r["pool"] for r in results["cases"] if r["batch"] == batch):
        rows = [r for r in results["cases"] if r["batch"] == batch and r["pool"] == pool and "us" in r]
        rows = [r for r in rows if max(r["rel_err"], r["rel_err_after"]) < 0.1]  # a wrong result never wins
        if not rows:
            continue
        default = rows[0]
        best = min(rows, key=lambda r: r["us"])
        knobs = {k: best[k] for k in ("block_n", "num_warps", "num_stages", "num_splits", "split_tokens", "pdl_merge",
                                      "fused_merge", "merge_chunk", "early_start", "prefetch", "dynamic_splits",
                                      "key_streams", "form", "lean")
                 if k in best}  # fmt: skip
        results.setdefault("best", {})[f"b{batch}_{pool}"] = best
        lines.append(f"b{batch} ctx{best['ctx']} {pool}: default {default['us']:.2f} us {default['gbps']:.0f} GB/s; "
                     f"best {best['us']:.2f} us {best['gbps']:.0f} GB/s {knobs} err {best['rel_err']:.1e}")  # fmt: skip
        if batch == 1 and pool in ("bf16", "bf16_wide", "bf16_engine") and best is not default:
            launch = small_launch(best)
            results.setdefault("small_launch", {})[pool] = {"launch": launch, "us": best["us"], "default_us":
                                                            default["us"]}  # fmt: skip
            lines.append(f"SMALL_LAUNCH {pool} {launch} {best['us']:.2f} us vs default {default['us']:.2f} us "
                         f"({best['us'] / default['us']:.3f}x)")  # fmt: skip
        # The fastest launch, in the engine's conditions, whose arithmetic equals the default's at contexts of one
        # 64-key tile (tiles of >= 64 keys, the default's warps): the engine's greedy-token check (a 32-token prompt)
        # then compares equal numbers.
        safe = [r for r in rows if r.get("fused_merge") and r.get("block_n", 0) >= 64 and r.get("num_warps") == 4]
        if batch == 1 and pool == "bf16_engine" and safe:
            top = min(safe, key=lambda r: r["us"])
            results.setdefault("small_launch", {})["bf16_safe"] = {"launch": small_launch(top), "us": top["us"],
                                                                   "default_us": default["us"]}  # fmt: skip
            lines.append(f"SAFE_LAUNCH {small_launch(top)} {top['us']:.2f} us vs default {default['us']:.2f} us "
                         f"({top['us'] / default['us']:.3f}x)")  # fmt: skip
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--batches", default="64,1")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--best-fp8-launch", help="write the fastest fp8 launch at the largest batch here, as "
                   "FLOTILLA_DECODE_FP8_LAUNCH reads it (block_n,warps,stages,fp8_kv)")  # fmt: skip
    p.add_argument("--workers", type=int, default=0, help="child processes that compile every row first (Triton's "
                   "cache), each its share, so that the timing process only loads them")  # fmt: skip
    p.add_argument("--grid", default="kv15", choices=("kv15", "kvfp8", "kv30"), help="the batch-64 rows: session "
                   "16's `KV15_GRID`, session 24's `KVFP8_GRID` (the lean loop) or session 30's `KV30_GRID` (warps an "
                   "SM)")  # fmt: skip
    p.add_argument("--compile-part", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    torch.manual_seed(0)
    batches = [int(b) for b in a.batches.split(",")]
    if a.compile_part:
        i, n = (int(x) for x in a.compile_part.split("/"))
        for batch in batches:
            bench_batch(batch, a.ctx, {}, Path(a.json), part=(i, n), grid=a.grid)
        return
    if a.workers > 1:
        compile_in_workers(__file__, a.workers)
    results: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "cases": []}
    for batch in batches:
        bench_batch(batch, a.ctx, results, Path(a.json), grid=a.grid)
        torch.cuda.empty_cache()
        if a.best_fp8_launch:  # after each batch: a later one cut by a time limit still leaves it
            _write_best_fp8_launch(results["cases"], Path(a.best_fp8_launch))


def program_heads(row: dict) -> int:
    """KV heads one program of `row` covers: N for form "h<N>", all its streams for "h", else 1."""
    form = row.get("form") or ""
    return (int(form[1:]) if form[1:] else row["key_streams"]) if form.startswith("h") else 1


def engine_wave(row: dict, batch: int = 64, kv_heads: int = KV_HEADS, sms: int = 132) -> int:
    """FLOTILLA_DECODE_WAVE that gives the engine `row`'s splits at `batch` (`default_num_splits`: splits =
    wave x SMs // programs, programs = batch x KV heads / the heads a program covers)."""
    programs = batch * (kv_heads // program_heads(row))
    splits = row.get("num_splits", 1)
    wave = -(-splits * programs // sms)
    assert wave * sms // programs == splits, (row, wave)
    return wave


def _write_best_fp8_launch(cases: list[dict], path: Path) -> None:
    """The fastest fp8 row at the largest batch so far, as FLOTILLA_DECODE_FP8_LAUNCH reads it (every fp8 row
    names its tile), then a space and FLOTILLA_DECODE_WAVE for its splits at batch 64 on 132 SMs (`engine_wave`).
    Rows with the fused merge are left out (FLOTILLA_DECODE_FUSED_MERGE is not in this file's format)."""
    rows = [r for r in cases if r["pool"].startswith("fp8_") and "us" in r and "block_n" in r and
            r.get("rel_err", 1) < 0.1 and not r.get("fused_merge") and not r.get("table")]  # fmt: skip
    if rows:
        top = min((r for r in rows if r["batch"] == max(r["batch"] for r in rows)), key=lambda r: r["us"])
        more = f",{top.get('key_streams', 0)}{top.get('form', '')}"
        wave = engine_wave(top)
        path.write_text(f"{top['block_n']},{top['num_warps']},{top['num_stages']},{top['pool'].removeprefix('fp8_')}"
                        f"{more} {wave}\n")  # fmt: skip


if __name__ == "__main__":
    main()

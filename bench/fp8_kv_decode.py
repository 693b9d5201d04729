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

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16


def _launch(block_n: int, warps: int, stages: int, **more) -> dict:
    return {"block_n": block_n, "num_warps": warps, "num_stages": stages, **more}


def cases(batch: int) -> list[tuple[str, str | None, dict]]:
    """(pool, fp8_kv, launch) rows. Batch 64 (512 programs at one split): the bf16 pool at its default, the fp8
    plain loop (cvtpx 64/4/3: 161.8 us in 2026-12-04 s7 call 4; perm), and around that call's fastest, one key
    stream a warp at 32/2/4 (146.3 us): depth, 2- and 4-warp tiles. Batch 1: bf16 at its default and with 128
    splits of 32 keys, fp8 cvtpx plain and in streams. Earlier lists (`git log -p bench/fp8_kv_decode.py`):
    call 2 (kv7 @250e64f) the s6 asm and cvt16 paths, perm_k / cvtpx_k, 64/8 tiles, 16 / 64 splits, the merge by
    dependent launch; call 4 (@d97ebf7) also one batched stream (key_streams 1: 268 us) and a 128-register cap
    (maxnreg: 201-1,577 us), both dropped."""
    if batch > 1:
        # Session 11 (fp8kv11): main's default first among the fp8 rows (the baseline), then the transposed key
        # streams ("t", `_attend_streams_t`: 128 registers against 170, 301 loop instructions against 398 under Triton
        # 3.6) and the transposed streams over neighbouring KV heads ("h", `_attend_heads_t`: a program reads a
        # key's heads side by side), at one split and at 2 or 4 (the registers now let 8 two-warp or 16 one-warp
        # programs share an SM: 1,024 / 2,048 programs in one wave); likeliest first (a cut sweep keeps its rows).
        main_default = _launch(32, 2, 4, key_streams=2, form="")
        rows: list[tuple[str, str | None, dict]] = [("bf16", None, {}), ("fp8", "cvtpx", main_default)]
        grid = (("t", 32, 2, 3, 2), ("t", 16, 1, 3, 4), ("h", 16, 2, 2, 4), ("h", 16, 4, 2, 4), ("t", 32, 2, 4, 1),
                ("t", 32, 2, 2, 2), ("h", 16, 8, 2, 4), ("t", 16, 1, 3, 3))  # fmt: skip
        rows += [("fp8", "cvtpx", _launch(b, w, st, key_streams=w, form=f, num_splits=sp)) for f, b, w, st, sp in grid]
        rows += [("fp8", "cvtpx", _launch(32, 2, 3, key_streams=2, form="t", num_splits=2, fused_merge=True)),
                 ("fp8", "cvtpx", _launch(16, 1, 3, key_streams=1, form="t", num_splits=4, fused_merge=True)),
                 ("fp8", "cvtpx", _launch(32, 2, 3, key_streams=2, form="", num_splits=2))]  # fmt: skip
        return rows
    return [("bf16", None, {}), ("bf16", None, _launch(32, 4, 2, num_splits=128)), ("fp8", "cvtpx", _launch(64, 4, 3)),
            ("fp8", "cvtpx", _launch(32, 2, 4, key_streams=2, form=""))]  # fmt: skip


def bench_batch(batch: int, ctx: int, results: dict, path: Path) -> None:
    """Every configuration on the bf16 pool and on the same values in fp8, each fp8 operand path."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from kernels import graph_ms  # bench/kernels.py

    blocks = batch * ctx // PAGE
    sets = max(1, -(-(256 << 20) // (2 * blocks * PAGE * KV_HEADS * HEAD_DIM * 2)))
    k16 = torch.randn(sets * blocks, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v16 = torch.randn_like(k16)
    pools = {"bf16": (k16, v16), "fp8": (k16.to(torch.float8_e4m3fn), v16.to(torch.float8_e4m3fn))}
    tables = torch.randperm(sets * blocks, device="cuda", dtype=torch.int32).view(sets, batch, -1)
    queries = {"bf16": torch.randn(sets, batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)}
    qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    k8, v8 = pools["fp8"]
    ref = paged_decode_attention(queries["bf16"][0], k8.to(torch.bfloat16), v8.to(torch.bfloat16), tables[0], qsl,
                                 lens, HEAD_DIM**-0.5).float()  # fmt: skip
    calls = 20 if batch >= 16 else 100

    def attend(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: dict):
        return lambda i: paged_decode_attention(query[i % sets], k, v, tables[i % sets], qsl, lens, HEAD_DIM**-0.5,
                                                **cfg)  # fmt: skip

    for pool, mode, cfg in cases(batch):
        k, v = pools[pool]
        fn = attend(queries["bf16"], k, v, cfg | ({"fp8_kv": mode} if mode else {}))
        nbytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k.element_size()
        name = pool if pool == "bf16" else f"fp8_{mode}"
        row: dict = {"batch": batch, "ctx": ctx, "pool": name, **cfg}
        try:
            err = ((fn(0).float() - ref).norm() / ref.norm()).item()
            ms = graph_ms(fn, calls)
            row.update(us=1e3 * ms, gbps=nbytes / ms / 1e6, rel_err=err)
        except Exception as exc:  # a configuration that does not compile is recorded
            row["error"] = repr(exc)[:200]
        results["cases"].append(row)
        print(" ", {x: row[x] for x in row if x not in ("batch", "ctx")}, flush=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    for pool in dict.fromkeys(r["pool"] for r in results["cases"] if r["batch"] == batch):
        rows = [r for r in results["cases"] if r["batch"] == batch and r["pool"] == pool and "us" in r]
        if not rows:
            continue
        default = rows[0]
        best = min(rows, key=lambda r: r["us"])
        knobs = {k: best[k] for k in ("block_n", "num_warps", "num_stages", "num_splits", "pdl_merge", "key_streams",
                                      "form", "fused_merge") if k in best}  # fmt: skip
        results.setdefault("best", {})[f"b{batch}_{pool}"] = best
        print(
            f"b{batch} ctx{ctx} {pool}: default {default['us']:.1f} us {default['gbps']:.0f} GB/s; "
            f"best {best['us']:.1f} us {best['gbps']:.0f} GB/s {knobs} err {best['rel_err']:.1e}",
            flush=True,
        )
    path.write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--batches", default="64,1")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--best-fp8-launch", help="write the fastest fp8 launch at the largest batch here, as "
                   "FLOTILLA_DECODE_FP8_LAUNCH reads it (block_n,warps,stages,fp8_kv)")  # fmt: skip
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    torch.manual_seed(0)
    results: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "cases": []}
    for batch in (int(b) for b in a.batches.split(",")):
        bench_batch(batch, a.ctx, results, Path(a.json))
        torch.cuda.empty_cache()
        if a.best_fp8_launch:  # after each batch: a later one cut by a time limit still leaves it
            _write_best_fp8_launch(results["cases"], Path(a.best_fp8_launch))


def engine_wave(row: dict, batch: int = 64, kv_heads: int = KV_HEADS, sms: int = 132) -> int:
    """FLOTILLA_DECODE_WAVE that gives the engine `row`'s splits at `batch` (`default_num_splits`: splits =
    wave x SMs // programs, programs = batch x KV heads, or x KV heads / streams for streams over heads)."""
    programs = batch * (kv_heads // row["key_streams"] if row.get("form") == "h" else kv_heads)
    splits = row.get("num_splits", 1)
    wave = -(-splits * programs // sms)
    assert wave * sms // programs == splits, (row, wave)
    return wave


def _write_best_fp8_launch(cases: list[dict], path: Path) -> None:
    """The fastest fp8 row at the largest batch so far, as FLOTILLA_DECODE_FP8_LAUNCH reads it (every fp8 row
    names its tile), then a space and FLOTILLA_DECODE_WAVE for its splits at batch 64 on 132 SMs (`engine_wave`).
    Rows with the fused merge are left out (FLOTILLA_DECODE_FUSED_MERGE is not in this file's format)."""
    rows = [r for r in cases if r["pool"].startswith("fp8_") and "us" in r and "block_n" in r and
            r.get("rel_err", 1) < 0.1 and not r.get("fused_merge")]  # fmt: skip
    if rows:
        top = min((r for r in rows if r["batch"] == max(r["batch"] for r in rows)), key=lambda r: r["us"])
        more = f",{top.get('key_streams', 0)}{top.get('form', '')}"
        wave = engine_wave(top)
        path.write_text(f"{top['block_n']},{top['num_warps']},{top['num_stages']},{top['pool'].removeprefix('fp8_')}"
                        f"{more} {wave}\n")  # fmt: skip


if __name__ == "__main__":
    main()

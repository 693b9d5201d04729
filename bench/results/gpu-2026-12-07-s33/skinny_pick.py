"""Session 33 (helper skinny33): the Python half of skinny.sh. Three commands:

    python3 skinny_pick.py config SWEEP_JSON   the sweep's FLOTILLA_SKINNY_GEMM_CONFIGS value (the card's whole table
                                               with the descent's 32-row entries), or nothing when it changed nothing
    python3 skinny_pick.py summary WORK_DIR    the SUMMARY lines from WORK_DIR's sweep.json, ttft-old.json and
                                               ttft-new.json
    python3 skinny_pick.py hopper              without a GPU (skinny.sh's DRY=1, the interpreter off): every candidate
                                               of the descent's first round compiled for sm_90 by Triton and ptxas
                                               (tests/kernels/test_hopper_compile.py's way), its shared memory
                                               within the H100/H200's 227 KB a block
    python3 skinny_pick.py selftest            without a GPU (skinny.sh's DRY=1, TRITON_INTERPRET=1): every candidate of
                                               the descent's first round launched under the interpreter at small shapes
                                               against `skinny_gemm_ref`, the adopt spec parsed back, `config` and
                                               `summary` on made-up JSON

The verdict (`ADOPT` or `keep`): a table is worth adopting for the card it ran on when the in-engine A/B's two new
phases both beat both orig phases by `MIN_GAIN_US` or more a replay, the greedy tokens of the cached-prefix request
are equal under both, and bench/prefix.py's cached TTFT under the new table (when it ran) is not above the old one's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/: tile_families, tile_descent
MIN_GAIN_US = 20.0  # a replay is ~5 ms; 20 us (0.4 %) is several times the A/B phases' spread on graphs of this size
ISSUE_RATIO = 10.0  # issue 19: uncached / cached TTFT >= 10x (H200; s23: 49.06 / 5.74 ms = 8.55x)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def config(sweep: dict) -> str:
    """The sweep's table as FLOTILLA_SKINNY_GEMM_CONFIGS, "" when the descent kept every start tile (or never ended)."""
    final, start = sweep.get("final_table"), sweep.get("start_table")
    if not final or final == start:
        return ""
    line = next((x for x in sweep.get("adopt", []) if x.startswith("FLOTILLA_SKINNY_GEMM_CONFIGS=")), "")
    return line.partition("=")[2].strip('"')


def _short(tile: dict) -> str:
    if tile.get("cublas"):
        return "cublas"
    return "bn={block_n},bk={block_k},sk={split_k},w={num_warps},s={num_stages},t={tma}".format(**tile)


def _ttft_line(name: str, r: dict) -> tuple[str, float | None]:
    s = r.get("single_cold_vs_warm")
    if not s:
        return f"SUMMARY ttft {name}: none ({'no JSON' if not r else 'no single_cold_vs_warm'})", None
    cached = 1e3 * s["cached_ttft_s"]
    line = (f"SUMMARY ttft {name}: uncached {1e3 * s['uncached_ttft_s']:.2f} ms, cached {cached:.2f} ms -> "
            f"{s['speedup']:.2f}x ({'MEETS' if s['speedup'] >= ISSUE_RATIO else 'misses'} {ISSUE_RATIO:g}x); "
            f"cached pairs {[round(1e3 * w, 2) for _, w in s['pairs_s']]}")  # fmt: skip
    p = r.get("cached_request_profile")
    if p:
        gemm = sum(k["us"] for k in p["kernels"] if "gemm" in k["name"].lower())
        line += (f"; profiled GPU busy {p['gpu_busy_us']:.0f} us, kernels named *gemm* {gemm:.0f} us (top 30); groups "
                 + ", ".join(f"{g} {us:.0f}" for g, us in list(p["groups_us"].items())[:6]))  # fmt: skip
    return line, cached


def summary(work: Path) -> list[str]:
    """The SUMMARY lines (module docstring)."""
    sw = _load(work / "sweep.json")
    out = [f"SUMMARY skinny33 on {sw.get('device', '?')}: the skinny GEMM's 32-row tiles chosen in the engine (a "
           f"20-token extend over 2,000 cached tokens, its one-sequence mixed graph replayed); timed {sw.get('timed')}"]
    ab = sw.get("ab")
    gain_ok = tokens_ok = False
    if ab:
        o, n = ab["phases"]["orig"], ab["phases"]["new"]
        gain = 1e3 * (min(o) - max(n))
        gain_ok, tokens_ok = gain >= MIN_GAIN_US, bool(sw.get("tokens_equal"))
        out.append(f"SUMMARY A/B a replay: orig {ab['orig']:.3f} ms {o}, new {ab['new']:.3f} ms {n} "
                   f"({1e3 * (ab['new'] - ab['orig']):+.1f} us; the worst new beats the best orig by {gain:.1f} us); "
                   f"greedy tokens equal: {sw.get('tokens_equal')}; descent stopped by the budget: "
                   f"{sw.get('descent_stopped_early')}; {len(sw.get('phases', []))} phases")  # fmt: skip
        for shape, t in (sw.get("final_table") or {}).items():
            s = sw["start_table"][shape]
            out.append(f"SUMMARY {shape}: {'same' if t == s else 'CHANGED'} {_short(s)} -> {_short(t)}")
    else:
        out.append(f"SUMMARY sweep: no A/B ({sw.get('error', 'cut before the end or failed')}); phases so far "
                   f"{len(sw.get('phases', []))}; see sweep.out in sides.tgz")  # fmt: skip
    old_line, old = _ttft_line("old (the committed table)", _load(work / "ttft-old.json"))
    new_line, new = _ttft_line("new (the sweep's table)", _load(work / "ttft-new.json"))
    out += [old_line, new_line]
    ttft_ok = new is None or old is None or new <= old
    if old is not None and new is not None:
        out.append(f"SUMMARY ttft cached new - old: {new - old:+.3f} ms")
    cfg = config(sw)
    adopt = bool(cfg) and gain_ok and tokens_ok and ttft_ok
    why = (f"A/B gain >= {MIN_GAIN_US:g} us: {gain_ok}, tokens equal: {tokens_ok}, cached TTFT not worse: {ttft_ok}"
           if cfg else "the descent kept the committed table (or did not finish)")
    out.append(f"SUMMARY verdict: {'ADOPT' if adopt else 'keep'} ({why})")
    if adopt:
        card = sw.get("device", "?")
        out.append(f'SUMMARY adopt: triton_skinny_gemm.MEASURED_CONFIGS["{card}"] = "{cfg}"')
    return out


def _selftest() -> None:
    """skinny.sh's DRY=1 checks (module docstring); run under TRITON_INTERPRET=1."""
    import tempfile

    import torch
    from tile_families import SKINNY32, skinny_config, skinny_spec

    from flotilla.kernels.triton_skinny_gemm import configs, parse_configs, skinny_gemm, skinny_gemm_ref

    start = SKINNY32.start(None, 132)
    assert start == {s: dict(t) for s, t in start.items()} and not any(t["cublas"] for t in start.values()), start
    launched = 0
    for shape, tile in start.items():
        gated = shape == "gate_up"
        for cand in SKINNY32.candidates(shape, tile, 14):
            cfg = skinny_config(cand)
            if cfg is None:
                continue
            n = max(2 * cfg.block_n, 256)  # whole 128-wide tiles (`supported`), two or more column tiles
            k = 2 * cfg.block_k * cfg.split_k  # two K steps a split
            g = torch.Generator().manual_seed(launched)
            x = torch.randn(20, k, generator=g).to(torch.bfloat16)
            w = (torch.randn((2 if gated else 1) * n, k, generator=g) / k**0.5).to(torch.bfloat16)
            out, ref = skinny_gemm(x, w, gated=gated, config=cfg).float(), skinny_gemm_ref(x, w, gated=gated).float()
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 2e-2, (shape, cand, err)
            launched += 1
    print(f"selftest: {launched} candidate launches (first round, every shape) match skinny_gemm_ref")
    moved = {**start, "down": dict(start["down"], split_k=4), "qkv": dict(start["qkv"], cublas=1)}
    table = parse_configs(skinny_spec(moved, None))
    assert table == {**configs(None), (4096, 14336, 32, False): skinny_config(moved["down"]),
                     (6144, 4096, 32, False): None}, "adopt spec"  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        spec = skinny_spec(moved, None)
        sweep = {"device": "NVIDIA H100 80GB HBM3", "timed": {"new_tokens": 20}, "start_table": start,
                 "final_table": moved, "adopt": ["x", f'FLOTILLA_SKINNY_GEMM_CONFIGS="{spec}"'], "tokens_equal": True,
                 "descent_stopped_early": False, "phases": [{}] * 40,
                 "ab": {"orig": 5.0, "new": 4.9, "phases": {"orig": [5.0, 5.01], "new": [4.9, 4.91]}}}  # fmt: skip
        (work / "sweep.json").write_text(json.dumps(sweep))
        ttft = {"single_cold_vs_warm": {"uncached_ttft_s": 0.049, "cached_ttft_s": 0.0057, "speedup": 8.6,
                                        "pairs_s": [[0.049, 0.0057]]}}  # fmt: skip
        (work / "ttft-old.json").write_text(json.dumps(ttft))
        assert config(sweep) == spec and config({**sweep, "final_table": start}) == ""
        lines = summary(work)
        assert any(x.startswith("SUMMARY verdict: ADOPT") for x in lines), lines
        assert any(x.startswith('SUMMARY adopt: triton_skinny_gemm.MEASURED_CONFIGS["NVIDIA H100') for x in lines)
        assert any("SUMMARY down: CHANGED" in x for x in lines) and any("ttft new" in x and "none" in x for x in lines)
        sweep["ab"]["phases"]["new"] = [4.9, 4.995]  # the worst new phase within 20 us of the best orig: keep
        (work / "sweep.json").write_text(json.dumps(sweep))
        assert any(x.startswith("SUMMARY verdict: keep") for x in summary(work))
        print("\n".join(lines))
    print("selftest: ok")


def _hopper() -> None:
    """skinny.sh's DRY=1 compile check (module docstring): the interpreter accepts code the compiler refuses, and a
    tile's shared memory is known only from its compile."""
    sys.path.insert(0, str(HERE.parents[2] / "tests" / "kernels"))
    import test_hopper_compile as hopper
    import triton
    import triton.language as tl
    from tile_families import SKINNY32, SKINNY_BM
    from triton.backends.compiler import GPUTarget

    from flotilla.kernels.triton_skinny_gemm import _skinny_gemm_kernel, _skinny_gemm_tma_kernel

    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32",
                "counter_ptr": "*i32"}  # fmt: skip
    compiled = 0
    for shape, tile in SKINNY32.start(None, 132).items():
        for c in (c for c in SKINNY32.candidates(shape, tile, 14) if not c["cublas"]):
            constexprs = dict(BLOCK_N=c["block_n"], BLOCK_M=SKINNY_BM, BLOCK_K=c["block_k"], HAS_BIAS=False,
                              DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", SPLIT=c["split_k"] > 1,
                              GATED=shape == "gate_up")  # fmt: skip
            fn = _skinny_gemm_tma_kernel if c["tma"] else _skinny_gemm_kernel
            if c["tma"]:
                aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("M", "N", "K", "k_per_split",
                                                                                         "stride_om"))  # fmt: skip
                args = pointers | {"x_desc": f"tensordesc<bf16[{SKINNY_BM}, {c['block_k']}]>",
                                   "w_desc": f"tensordesc<bf16[{c['block_n']}, {c['block_k']}]>"}  # fmt: skip
            else:
                aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("M", "N", "K", "k_per_split")
                                or n.startswith("stride_"))  # fmt: skip
                args, constexprs = pointers, dict(constexprs, EVEN=True)
            constexprs = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | constexprs
            attrs = {path: [["tt.divisibility", 16]] for path in hopper._aligned_paths(fn, aligned)}
            src = triton.compiler.ASTSource(fn, hopper._signature(fn, args, constexprs), constexprs, attrs=attrs)
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": c["num_warps"], "num_stages": c["num_stages"]})  # fmt: skip
            assert kernel.metadata.shared <= 227 * 1024, (shape, c, kernel.metadata.shared)
            compiled += 1
    print(f"hopper: {compiled} candidate kernels (first round, every shape) compile for sm_90 within 227 KB")


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "config":
        print(config(_load(Path(sys.argv[2]))))
    elif cmd == "summary":
        print("\n".join(summary(Path(sys.argv[2]))))
    elif cmd == "hopper":
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.exit("hopper: run with the interpreter off (the compiler's kernels)")
        _hopper()
    elif cmd == "selftest":
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("selftest: run with TRITON_INTERPRET=1 (the candidates' launches on the CPU)")
        _selftest()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

"""attn.sh's picks and summary (session 34, helper gpuprep34): batch-1 decode attention's serial chain, the "pages"
flag (a split's page numbers read up front) and the short-table launch (one tile a program at tables <= 1,024).

    python3 attn_pick.py variants KERNEL_JSON   # bench/small_launch_ab.py's --variants from the kernel rows
    python3 attn_pick.py summary DIR            # SUMMARY lines and the ADOPT verdict from DIR's JSON files
    python3 attn_pick.py selftest               # both on made-up JSON (no GPU)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

BF16_FLOOR_MS = 4.05  # issue 19: bf16 decode bs1 ctx 512 <= 1.15x the H200 roofline 3.52 ms
ATTN_FLOOR_GBPS = 2000  # issue 19: paged decode attention at batch 1 x 4,096 >= 2,000 GB/s
INT4_FLOOR = 0.45  # issue 22: int4 W4A16 bs1 ctx 512 <= 0.45x the bf16 step
FALLBACK = {"SMALL": "64,4,3,256,fused+dep+pages", "SHORT": "64,4,3,64,fused+dep"}


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kernel_rows(kernel: dict | None, shape: str) -> list[dict]:
    """The shape's rows in the plain form (the engine's: FLOTILLA_DECODE_EARLY_QUERY is off), fastest first."""
    return sorted((r for r in (kernel or {}).get("rows", []) if r["shape"] == shape and r["form"] == "plain"),
                  key=lambda r: r["us"])  # fmt: skip


def variants(kernel: dict | None) -> list[str]:
    """Two engine variants: SMALL = the fastest "pages" launch at b1e (it runs at every table width), SHORT = the
    fastest one-tile launch at e1s without "pages" (it runs at tables <= 1,024 only); each the committed candidate when
    the kernel stage gave no row for it (the engine A/B still answers)."""
    pages = [r["launch"] for r in kernel_rows(kernel, "b1e") if "pages" in r["launch"]]
    short = [r["launch"] for r in kernel_rows(kernel, "e1s") if r["launch"] != "default" and "pages" not in r["launch"]]
    return [f"SMALL={(pages or [FALLBACK['SMALL']])[0]}", f"SHORT={(short or [FALLBACK['SHORT']])[0]}"]


def launch_tuple(launch: str) -> str:
    """A launch string as the Python value of `_SMALL_LAUNCH` / `_SHORT_LAUNCH`."""
    fields = launch.split(",")
    chunk = int(fields[5]) if len(fields) > 5 else 0
    return f'({", ".join(fields[:4])}, "{fields[4]}", {chunk})'


def _kernel_lines(kernel: dict | None) -> list[str]:
    lines = []
    for shape in ("e1s", "e1k", "b1e", "b1", "b1fix"):
        rows = kernel_rows(kernel, shape)
        if not rows:
            continue
        base = next((r for r in rows if r["launch"] == "default"), None)
        cells = [f"{r['launch']} {r['us']:.2f}" + (f" ({r['us'] / base['us']:.3f}x)" if base else "") for r in rows]
        lines.append(f"SUMMARY kernel {shape} {rows[0]['ctx']}/{rows[0]['table']} (us, fastest first): "
                     + "; ".join(cells))  # fmt: skip
    for shape in ("b1", "b1e"):
        rows = kernel_rows(kernel, shape)
        if rows:
            base = next((r for r in rows if r["launch"] == "default"), rows[-1])
            lines.append(f"SUMMARY attention floor {shape} (>= {ATTN_FLOOR_GBPS} GB/s): default {base['gbps']:.0f}, "
                         f"best {rows[0]['gbps']:.0f} GB/s ({rows[0]['launch']})")  # fmt: skip
    return lines or ["SUMMARY kernel: no result"]


def summary(d: Path) -> list[str]:
    """SUMMARY lines: the kernel rows and floors, each engine's A/B, the step floors, the verdict."""
    lines = _kernel_lines(_load(d / "kernel.json"))
    eng = {}
    for name in ("bf16", "int4"):
        data = _load(d / f"{name}.json")
        s = (data or {}).get("summary")
        if not s or "main" not in s.get("ms", {}):
            lines.append(f"SUMMARY {name}: no result")
            continue
        eng[name] = s
        cells = [f"{v} {ms:.3f} ms" for v, ms in s["ms"].items()]
        lines.append(f"SUMMARY {name} bs1 ctx 512 (one engine, {data['device']}): " + "; ".join(cells))
        if "best" in s:
            lines.append(f"SUMMARY {name} best {s['best']}: {s['gain_us']:+.1f} us a step, every phase below main's "
                         f"{s['clean']}, greedy tokens equal {s['tokens_equal']}, verdict {s['verdict']}")  # fmt: skip
    bf16, int4 = eng.get("bf16", {}), eng.get("int4", {})
    if bf16:
        best = bf16.get("best", "main")
        lines.append(f"SUMMARY bf16 floor <= {BF16_FLOOR_MS} ms (H200): main {bf16['ms']['main']:.3f}, {best} "
                     f"{bf16['ms'][best]:.3f}")  # fmt: skip
        if int4:
            new = int4["ms"].get(best)
            ratio_new = f"{new / bf16['ms'][best]:.3f}x" if new else "n/a"
            lines.append(f"SUMMARY int4 / bf16 (floor <= {INT4_FLOOR}x): main "
                         f"{int4['ms']['main'] / bf16['ms']['main']:.3f}x, {best} {ratio_new}")  # fmt: skip
    best = bf16.get("best")
    int4_worse = bool(int4) and best in int4.get("ms", {}) and int4["ms"][best] > int4["ms"]["main"]
    if bf16.get("verdict") == "adopt" and not int4_worse:
        switch, _, launch = best.partition("=")
        lines.append(f"ADOPT kernels/triton_paged_decode._{switch}_LAUNCH = {launch_tuple(launch)} (bf16 "
                     f"{bf16['gain_us']:+.1f} us a step; cite this call in its comment; SMALL also changes the "
                     f"4,096 rows: see the kernel lines)")  # fmt: skip
    else:
        why = "int4 step slower" if int4_worse else f"bf16 verdict {bf16.get('verdict', 'no result')}"
        lines.append(f"ADOPT nothing ({why}): _SMALL_LAUNCH and _SHORT_LAUNCH stay as committed")
    return lines


def selftest() -> None:
    """variants and summary on made-up JSON: an adopt, an int4 veto, a missing engine."""
    def row(shape: str, launch: str, us: float, form: str = "plain") -> dict:
        ctx, table = {"e1s": (530, 704), "b1e": (4160, 4288)}[shape]
        return {"shape": shape, "ctx": ctx, "table": table, "form": form, "launch": launch, "us": us,
                "gbps": 2 * ctx * 8 * 128 * 2 / us / 1e3}  # fmt: skip

    kernel = {"rows": [row("e1s", "default", 9.8), row("e1s", "64,4,3,64,fused+dep", 6.9),
                       row("e1s", "64,4,3,256,fused+dep+pages", 6.5), row("b1e", "default", 10.3),
                       row("b1e", "32,4,4,256,fused+dep+pages", 8.1),
                       row("b1e", "64,4,3,256,fused+dep+pages", 7.0, "query")]}  # fmt: skip
    got = variants(kernel)
    assert got == ["SMALL=32,4,4,256,fused+dep+pages", "SHORT=64,4,3,64,fused+dep"], got
    assert variants(None) == [f"SMALL={FALLBACK['SMALL']}", f"SHORT={FALLBACK['SHORT']}"]
    assert launch_tuple("64,4,3,64,fused+dep") == '(64, 4, 3, 64, "fused+dep", 0)'
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "kernel.json").write_text(json.dumps(kernel))
        b = "SMALL=32,4,4,256,fused+dep+pages"
        verdict = {"best": b, "gain_us": 100.0, "clean": True, "tokens_equal": True, "verdict": "adopt"}
        bf16 = {"device": "NVIDIA H200", "summary": {"ms": {"main": 4.17, b: 4.07}, **verdict}}
        (d / "bf16.json").write_text(json.dumps(bf16))
        int4 = {"device": "NVIDIA H200", "summary": {"ms": {"main": 2.20, b: 2.10}}}
        (d / "int4.json").write_text(json.dumps(int4))
        out = summary(d)
        want = 'ADOPT kernels/triton_paged_decode._SMALL_LAUNCH = (32, 4, 4, 256, "fused+dep+pages", 0)'
        assert out[-1].startswith(want), out[-1]
        int4["summary"]["ms"][b] = 2.3
        (d / "int4.json").write_text(json.dumps(int4))
        assert summary(d)[-1].startswith("ADOPT nothing (int4")
        (d / "bf16.json").unlink()
        assert summary(d)[-1].startswith("ADOPT nothing")
    print("\n".join(out))
    print("selftest: ok")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "variants":
        print(";".join(variants(_load(Path(sys.argv[2])))))
    elif cmd == "summary":
        print("\n".join(summary(Path(sys.argv[2]))))
    else:
        selftest()

"""SUMMARY lines of prefix.sh's call (session 35): `python prefix_pick.py WORKDIR` reads kernel.json
(bench/extend_attention.py --set ab) and prefix-off.json / prefix-on.json (bench/prefix.py) from WORKDIR, whichever
exist, and prints the kernel's us a call (the engine's launch old vs live, the fastest live one), each engine's
cached/uncached TTFT pairs and ratio against issue 19's 10x floor, and the cached request's attention kernels."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kernel_lines(result: dict) -> list[str]:
    """One line a configuration, then the old launch against the fastest live one."""
    lines = [f"SUMMARY kernel {c['env']} live={c.get('live', 0)} pdl={c.get('pdl', 0)}: "
             f"{c.get('us', float('nan')):.2f} us "
             f"(rel err {c.get('rel_err', float('nan')):.1e}){' ' + c['error'][:80] if 'error' in c else ''}"
             for c in result.get("configs", [])]  # fmt: skip
    old, best = result.get("default"), result.get("best_live")
    if old and best:
        decode = result.get("decode_one_token_us", 0.0)
        lines.append(f"SUMMARY kernel old {old['us']:.2f} us -> best live {best['env']} pdl={best.get('pdl', 0)} "
                     f"{best['us']:.2f} us "
                     f"(x{old['us'] / best['us']:.2f}); decode kernel 1 token {decode:.2f} us")
    return lines


def engine_lines(name: str, result: dict) -> list[str]:
    """The TTFT pairs, the ratio against the 10x floor, and the cached request's attention kernels."""
    single = result.get("single_cold_vs_warm", {})
    lines = []
    if single:
        cold, warm = 1e3 * single["uncached_ttft_s"], 1e3 * single["cached_ttft_s"]
        pairs = [round(1e3 * w, 2) for _, w in single["pairs_s"]]
        verdict = "meets" if cold >= 10 * warm else f"misses (needs cached <= {cold / 10:.2f} ms)"
        lines.append(f"SUMMARY {name}: uncached {cold:.2f} ms, cached {warm:.2f} ms -> {cold / warm:.2f}x, {verdict} "
                     f"the 10x floor; cached pairs {pairs}")
    profile = result.get("cached_request_profile")
    if profile:
        attn = {k["name"]: (round(k["us"], 1), k["launches"]) for k in profile["kernels"]
                if k["name"] in ("_prefill_kernel", "split_merge_kernel")}
        lines.append(f"SUMMARY {name} profile: GPU busy {profile['gpu_busy_us']:.0f} us, attention "
                     f"{profile['groups_us'].get('attention', 0):.0f} us {attn}")
    return lines


def main() -> None:
    work = Path(sys.argv[1])
    lines: list[str] = []
    kernel = _load(work / "kernel.json")
    if kernel:
        lines += kernel_lines(kernel)
    for name in ("off", "on"):
        result = _load(work / f"prefix-{name}.json")
        if result:
            lines += engine_lines(name, result)
    print("\n".join(lines) if lines else "SUMMARY nothing to read in " + str(work))


if __name__ == "__main__":
    main()

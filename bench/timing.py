"""How the GEMV benchmarks (bench/fp8_gemv.py, bench/lm_head_gemv.py, bench/int4_gemv.py, bench/gated_gemv.py) time a
variant: its first output checked against a reference, then many calls in one CUDA graph rotating over weight copies
(bench/kernels.py's `graph_ms`, which bench/skinny_gemm.py and bench/gemv_rope.py call directly: they check one
configuration, or bit for bit, apart from the timing), and the fastest accurate variant of a family picked from the
rows."""

from __future__ import annotations

from collections.abc import Callable

import torch


def time_variant(fn: Callable[[int], torch.Tensor], calls: int, ref: torch.Tensor, nbytes: int, replays: int = 15,
                 checks: Callable[[torch.Tensor], dict] | None = None) -> dict:  # fmt: skip
    """`fn(0)` against `ref`, then `fn(0..calls-1)` in one CUDA graph: {"ms", "us" (a call), "gbps" (`nbytes` a call),
    "rel_err", **checks(fn(0))}, or {"error": repr} where anything fails (a config out of resources, a missing fp8
    GEMM: recorded, not fatal)."""
    from kernels import graph_ms, rel_err  # bench/kernels.py (imports Triton: only where something is timed)

    try:
        out = fn(0)
        err = rel_err(out, ref)
        more = checks(out) if checks else {}
        ms = graph_ms(fn, calls, replays)
        return {"ms": ms, "us": 1e3 * ms, "gbps": nbytes / ms / 1e6, "rel_err": err, **more}
    except Exception as exc:
        return {"error": repr(exc)[:300]}


def fastest(rows: dict, prefix: str, max_rel_err: float = 1e-2) -> str | None:
    """The tag of the fastest timed row of `rows` whose tag starts with `prefix` and whose error is under
    `max_rel_err` (None where there is none)."""
    timed = {t: v["ms"] for t, v in rows.items() if t.startswith(prefix) and isinstance(v, dict) and "ms" in v
             and v["rel_err"] < max_rel_err}  # fmt: skip
    return min(timed, key=timed.__getitem__) if timed else None

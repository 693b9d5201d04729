"""bench/timing.py: how the GEMV benchmarks time a variant and pick the fastest accurate one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import timing

ROWS = {
    "gemv a": {"ms": 0.30, "us": 300.0, "rel_err": 1e-3},
    "gemv b": {"ms": 0.20, "us": 200.0, "rel_err": 5e-2},  # the fastest, but wrong
    "gemv c": {"ms": 0.25, "us": 250.0, "rel_err": 2e-3},
    "gemv d": {"error": "OutOfResources"},
    "cublas": {"ms": 0.10, "us": 100.0, "rel_err": 0.0},  # not of the family
    "skipped": ["gemv e"],
}


def test_fastest_is_the_quickest_accurate_row_of_the_family() -> None:
    assert timing.fastest(ROWS, "gemv") == "gemv c"
    assert timing.fastest(ROWS, "gemv", max_rel_err=0.1) == "gemv b"
    assert timing.fastest(ROWS, "fp8_gemv") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph timing needs a CUDA GPU")
def test_time_variant_times_a_product_and_records_a_failure() -> None:
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    row = timing.time_variant(lambda i: x @ w.T, 20, (x.float() @ w.float().T), w.nbytes,
                              checks=lambda out: {"rows": out.shape[0]})  # fmt: skip
    assert row["ms"] > 0 and row["us"] == pytest.approx(1e3 * row["ms"]) and row["rel_err"] < 1e-2
    assert row["gbps"] == pytest.approx(w.nbytes / row["ms"] / 1e6) and row["rows"] == 1

    def broken(i: int) -> torch.Tensor:
        raise RuntimeError("out of resources")

    assert timing.time_variant(broken, 20, x, 1) == {"error": "RuntimeError('out of resources')"}

"""bench/overlap_probe.py on the CPU: `--smoke` runs every case through the engine's kernels (the CPU references),
the schedules do a whole layer's work for every row, and the JSON holds what the device script's readers take."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import overlap_probe as op

CASES = {"gemm", "attn", "serial", "two_stream", "two_stream_att", "gemm_half", "attn_half", "both_free"}


def test_smoke_writes_every_case_fraction_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    returned = op.main(["--smoke", "--extras", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results == returned
    assert results["smoke"] is True and results["args"]["rows"] == "8,4"
    graphed = torch.cuda.is_available()  # CUDA graphs only on a GPU
    for rows in ("8", "4"):
        assert set(results["rows"][rows]) == CASES
        for times in results["rows"][rows].values():
            assert times["eager"] > 0
            assert (times["graph"] is not None) == graphed
        fractions = results["overlap"][rows]
        assert set(fractions) == {f"{case}_{mode}" for case in ("two_stream", "two_stream_att", "both_free")
                                  for mode in ("eager", "graph")}  # fmt: skip
        assert isinstance(fractions["two_stream_eager"], float)
    assert {k: v["eager"] > 0 for k, v in results["mixed"].items()} == {"gemm": True, "attn": True, "concurrent": True}
    assert isinstance(results["overlap"]["mixed_eager"], float)
    assert {"serial_halves", "ring_chunk2", "ring_chunk4"} <= set(results["extras"])
    summary = "\n".join(results["summary"])
    for line in ("R=8 eager: (a) gemm", "R=4 eager: (a) gemm", "(e) mixed eager: gemm 32 tokens", "overlap fraction"):
        assert line in summary


@pytest.mark.parametrize(("schedule", "chunks"), [("ring", 1), ("ring", 3), ("ring_att", 1)])
def test_two_nano_batches_compute_what_the_serial_step_does(schedule: str, chunks: int) -> None:
    model = op.Model(op.SMOKE, layers=3, weight_sets=2, device=torch.device("cpu"))
    probe = op.Probe(model, rows=10, ctx=40, cache_layers=2)
    x0, res0 = probe.full.x.clone(), probe.full.res.clone()
    probe.serial([probe.full])
    serial = probe.full.x.clone()
    assert not torch.equal(serial, x0)  # the layers did change the rows
    probe.full.x.copy_(x0)
    probe.full.res.copy_(res0)
    if schedule == "ring":
        probe.ring(model.lanes.stream(), chunks)
    else:
        probe.ring_att(model.lanes.stream(), chunks=chunks)
    torch.testing.assert_close(probe.full.x, serial, rtol=1e-2, atol=1e-4)  # |x| <= ~0.01


def test_mixed_step_runs_the_whole_gemm_chain_of_its_tokens() -> None:
    model = op.Model(op.SMOKE, layers=2, weight_sets=2, device=torch.device("cpu"))
    probe = op.Probe(model, rows=6, ctx=40, cache_layers=2)
    big = model.rows(24)
    x0 = big.x.clone()
    model.gemm_only(big)
    alone = big.x.clone()
    big.x.copy_(x0)
    probe.mixed(big, model.lanes.stream())
    torch.testing.assert_close(big.x, alone, rtol=0, atol=0)


def test_overlap_fraction() -> None:
    assert op.overlap_fraction(10.0, 4.0, 10.0) == 1.0  # the attention entirely under the GEMMs
    assert op.overlap_fraction(10.0, 4.0, 14.0) == 0.0  # one after the other
    assert op.overlap_fraction(10.0, 4.0, 16.0) == -0.5  # slower than serial
    assert op.overlap_fraction(10.0, None, 12.0) is None


def test_no_gpu_and_no_smoke_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the full probe would run")
    assert op.main([]) is None
    assert "skipped" in capsys.readouterr().out

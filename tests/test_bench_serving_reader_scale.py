"""bench/serving_reader_scale.py still runs against the current serving reader: its own entry point, small.

The reader scrapes only names.HTTP_PORT of the pods each InferenceService's own Deployment made (by uid, through
their ReplicaSet): a bench whose fake pods or stand-in API server no longer satisfy that rule reads nothing, and
this test fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import serving_reader_scale


def test_the_scale_bench_reads_every_fake_engine_pod(capsys: pytest.CaptureFixture[str]) -> None:
    serving_reader_scale.main(["--services", "2", "--pods", "2", "--periods", "2", "--period", "1"])
    result = json.loads(capsys.readouterr().out)
    assert result["pods"] == 4
    assert result["unreachable_scrapes"] == 0
    assert result["all_figures_present"] is True  # every service: both pods scraped, and a TTFT p95 computed
    assert result["writes_per_period"] >= 2  # both services' status written
    assert result["max_staleness_periods"] <= 1

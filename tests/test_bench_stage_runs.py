"""bench/stage_runs.py: what the summary of a device script with a bf16 baseline (bench/results/bf16-stages.sh) reads
of its stages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import stage_runs


def test_load_runs_stands_an_error_in_for_a_missing_or_cut_stage(tmp_path: Path) -> None:
    (tmp_path / "bf16.json").write_text(json.dumps({"latency": [{"batch": 4, "ms_per_step": 9.0},
                                                                {"batch": 1, "ms_per_step": 5.713, "graphed_steps": 32,
                                                                 "steps": 32}]}))  # fmt: skip
    (tmp_path / "int4.json").write_text('{"ab": ')  # a stage killed while writing
    runs = stage_runs.load_runs(str(tmp_path), ("int4", "bf16", "sweep"))
    assert runs["int4"] == {"error": "no result (JSONDecodeError)"}
    assert runs["sweep"] == {"error": "no result (FileNotFoundError)"}
    row, ms = stage_runs.bf16_bs1(runs["bf16"])
    assert ms == 5.713 and row is not None and row["batch"] == 1
    assert stage_runs.bf16_line(runs["bf16"]) == "SUMMARY bf16 bs1 ctx512: 5.713 ms"
    assert stage_runs.bf16_line(runs["bf16"], graphed=True) == "SUMMARY bf16 bs1 ctx512: 5.713 ms (graphed 32/32)"
    assert stage_runs.bf16_line(runs["sweep"], graphed=True) == "SUMMARY bf16 bs1 ctx512: no result (FileNotFoundError)"
    assert stage_runs.bf16_bs1({"latency": []}) == (None, None)
    assert stage_runs.bf16_line({"latency": []}) == "SUMMARY bf16 bs1 ctx512: no latency row"

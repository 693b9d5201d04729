"""What the summary of a bench/results/*-gpu.sh call with a bf16 baseline reads (bench/results/bf16-stages.sh): each
stage's JSON, and the bf16 bs1 ctx 512 step of bench/decode_ab.py's latency rows (a ratio's denominator)."""

from __future__ import annotations

import json


def load_runs(workdir: str, labels: tuple[str, ...]) -> dict[str, dict]:
    """Each label's `<workdir>/<label>.json`, or {"error": ...} for a stage that wrote none (cut, failed)."""
    runs = {}
    for label in labels:
        try:
            with open(f"{workdir}/{label}.json") as f:
                runs[label] = json.load(f)
        except (OSError, ValueError) as e:
            runs[label] = {"error": f"no result ({e.__class__.__name__})"}
    return runs


def bf16_bs1(bf: dict) -> tuple[dict | None, float | None]:
    """The bf16 run's batch-1 latency row and its ms a step (None, None without one)."""
    row = next((r for r in bf.get("latency", []) if r["batch"] == 1), None)
    return row, (row["ms_per_step"] if row else None)


def bf16_line(bf: dict, graphed: bool = False) -> str:
    """The "SUMMARY bf16 bs1 ctx512" line: ms a step (with `graphed`, the graphed steps of the timed ones), or why
    there is none."""
    row, ms = bf16_bs1(bf)
    line = f"SUMMARY bf16 bs1 ctx512: {f'{ms:.3f} ms' if ms else bf.get('error', 'no latency row')}"
    return line + (f" (graphed {row['graphed_steps']}/{row['steps']})" if graphed and row else "")

"""Summarize a step trace (`FLOTILLA_STEP_TRACE=PATH`, engine/step_trace.py): what the steps held and
where the loop's time went, per run.

    python bench/step_trace_report.py /tmp/steps.jsonl [more.jsonl ...] [--json out.json]

A trace may hold several runs (a warm-up and the measured run): a step that leaves the engine empty
ends a run, and so does a pause of more than `--gap` seconds between steps. Per run: steps by kind
(pure decode, pure prefill, mixed), wall time, tokens and rows per step, how many ran from a CUDA
graph, the host's and the device wait's share (`host_ms`, `sync_ms`), the core's pipe writes
(`send_ms`), running requests, and the engine's own time to first token (from the request reaching
the engine). A server's `PATH.api` beside the trace (the API process's reads) adds its batches and
handling time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path


def kind(step: dict) -> str:
    """pure decode, pure prefill, or mixed (decode rows beside prompt tokens)."""
    if not step["prefill"]:
        return "decode"
    return "prefill" if not step["decode"] else "mixed"


def split_runs(steps: list[dict], gap: float) -> list[list[dict]]:
    """The trace's runs: a step that leaves the engine empty (nothing running or waiting) ends one, and a
    pause longer than `gap` seconds between two steps separates them."""
    runs: list[list[dict]] = []
    for step in steps:
        if not runs or step["t"] - runs[-1][-1]["t"] > gap or _drained(runs[-1][-1]):
            runs.append([])
        runs[-1].append(step)
    return runs


def _drained(step: dict) -> bool:
    return not step["running"] and not step["waiting"]


def summarize(run: list[dict]) -> dict:
    """One run's figures."""
    wall = run[-1]["t"] - run[0]["t"] + run[0]["step_ms"] / 1e3
    out: dict = {"steps": len(run), "wall_s": round(wall, 2),
                 "decode_rows": sum(s["decode"] for s in run), "prompts": sum(s.get("first", 0) for s in run)}
    out["decode_rows_per_s"] = round(out["decode_rows"] / wall, 1) if wall > 0 else 0.0
    for name in ("decode", "prefill", "mixed"):
        group = [s for s in run if kind(s) == name]
        if not group:
            continue
        times = [b["t"] - a["t"] for a, b in itertools.pairwise(run) if kind(b) == name]
        out[name] = {
            "steps": len(group),
            "wall_s": round(sum(times), 2),
            "graphed": sum(1 for s in group if s["graph"]),
            "tokens_median": statistics.median(s["tokens"] for s in group),
            "decode_rows_median": statistics.median(s["decode"] for s in group),
            "prefill_rows_median": statistics.median(s["prefill"] for s in group),
            # from the step before's outputs to this step's: the loop's period while running such steps
            "interval_ms_median": round(statistics.median(times) * 1e3, 2) if times else None,
            "host_ms_median": round(statistics.median(s["host_ms"] for s in group), 2),
            "sync_ms_median": round(statistics.median(s["sync_ms"] for s in group), 2),
        }
    out["running_median"] = statistics.median(s["running"] for s in run)
    out["waiting_max"] = max(s["waiting"] for s in run)
    out["preempted"] = sum(s.get("preempted", 0) for s in run)
    sends = sum(s.get("send_ms", 0.0) for s in run)
    out["send_ms_total"] = round(sends, 1)
    out["send_ms_max"] = max((s.get("send_ms", 0.0) for s in run), default=0.0)
    firsts = sum(s.get("first", 0) for s in run)
    if firsts:
        out["engine_ttft_ms_mean"] = round(sum(s.get("ttft_ms", 0.0) for s in run) / firsts, 1)
    mixed_tokens = sorted(s["tokens"] for s in run if kind(s) == "mixed")
    if mixed_tokens:
        out["mixed_tokens_quartiles"] = [mixed_tokens[len(mixed_tokens) * q // 4] for q in (1, 2, 3)]
    return out


def summarize_api(reads: list[dict]) -> dict:
    """The API process's reads of the core's messages: how many steps each carried, and their handling."""
    if not reads:
        return {}
    handle = sorted(r["handle_ms"] for r in reads)
    return {"reads": len(reads), "messages": sum(r["messages"] for r in reads),
            "messages_per_read_max": max(r["messages"] for r in reads), "deltas": sum(r["deltas"] for r in reads),
            "handle_ms_total": round(sum(handle), 1), "handle_ms_median": handle[len(handle) // 2],
            "handle_ms_p99": handle[len(handle) * 99 // 100]}


def main() -> None:
    """Print (and optionally write) each trace's per-run summary."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--gap", type=float, default=1.0, help="seconds without a step that separate two runs")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    report = {}
    for path in a.traces:
        lines = Path(path).read_text().splitlines()
        steps = [json.loads(line) for line in lines if line.strip()]
        report[path] = [summarize(run) for run in split_runs(steps, a.gap)] if steps else []
        for i, run in enumerate(report[path]):
            print(f"{path} run {i}: {json.dumps(run)}")
        api = Path(path + ".api")
        if api.exists():
            reads = [json.loads(line) for line in api.read_text().splitlines() if line.strip()]
            report[str(api)] = summarize_api(reads)
            print(f"{api}: {json.dumps(report[str(api)])}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

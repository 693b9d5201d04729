"""Generate the Grafana dashboard flotilla.json from the panel list below (plain Python, no dependencies).

    python3 charts/flotilla/dashboards/generate.py           # rewrite flotilla.json
    python3 charts/flotilla/dashboards/generate.py --check   # exit 1 if flotilla.json is stale

Every query reads the engine's vLLM-named series. Series carry `model_name` (the engine), `namespace`
and `pod` (the Prometheus Operator's ServiceMonitor) and `serving_flotilla_dev_inferenceservice` (the
Service label `serving.flotilla.dev/inferenceservice`, copied by the ServiceMonitor's targetLabels).
tests/observability runs every query against a real Prometheus scraping a real engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("flotilla.json")
UID = "flotilla-serving"
ISVC = "serving_flotilla_dev_inferenceservice"
DS = {"type": "prometheus", "uid": "${datasource}"}
# Template variables: what every query filters on. `up` has no model_name, so it gets TARGET.
TARGET = f'namespace=~"$namespace", {ISVC}=~"$inferenceservice", pod=~"$pod"'
SEL = f'{TARGET}, model_name=~"$model"'
BY_SVC = f"namespace, {ISVC}"
BY_POD = f"namespace, {ISVC}, pod"
SVC_LEGEND = "{{namespace}}/{{" + ISVC + "}}"
POD_LEGEND = "{{pod}}"
RATE = "$__rate_interval"


def rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{SEL}}}[{RATE}]))"


def quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket{{{SEL}}}[{RATE}])))"


def gauge(metric: str, by: str, agg: str = "sum") -> str:
    return f"{agg} by ({by}) ({metric}{{{SEL}}})"


def percentiles(histogram: str) -> list[tuple[str, str]]:
    return [(quantile(q, histogram, BY_SVC), f"p{round(q * 100)} {SVC_LEGEND}") for q in (0.5, 0.9, 0.99)]


# (title, description, unit, [(expr, legend)], kind) per panel, grouped in rows.
ROWS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]], str]]]] = [
    ("Overview (per InferenceService)", [
        ("Replicas answering", "Engine pods whose /metrics Prometheus scraped successfully (up == 1).", "none",
         [(f"sum by ({BY_SVC}) (up{{{TARGET}}})", SVC_LEGEND)], "stat"),
        ("Requests/s", "Finished requests per second, all finish reasons.", "reqps",
         [(rate("vllm:request_success_total", BY_SVC), SVC_LEGEND)], "stat"),
        ("Generation tokens/s", "Output tokens per second.", "short",
         [(rate("vllm:generation_tokens_total", BY_SVC), SVC_LEGEND)], "stat"),
        ("Max KV-cache usage", "The fullest pod's KV-cache usage (1 = every block in use).", "percentunit",
         [(gauge("vllm:kv_cache_usage_perc", BY_SVC, "max"), SVC_LEGEND)], "stat"),
        ("Token throughput", "Prompt (prefill) and generation (decode) tokens per second.", "short",
         [(rate("vllm:prompt_tokens_total", BY_SVC), f"prompt {SVC_LEGEND}"),
          (rate("vllm:generation_tokens_total", BY_SVC), f"generation {SVC_LEGEND}")], "timeseries"),
        ("Requests running and waiting", "Requests in the running batch, and queued for admission.", "short",
         [(gauge("vllm:num_requests_running", BY_SVC), f"running {SVC_LEGEND}"),
          (gauge("vllm:num_requests_waiting", BY_SVC), f"waiting {SVC_LEGEND}")], "timeseries"),
    ]),
    ("Latency SLO (per InferenceService)", [
        ("TTFT p95 against the SLO", "Time-to-first-token p95 over all replicas (what spec.autoscaling metric "
         "ttft_p95_seconds scales on) and the SLO target ($ttft_slo s, a dashboard variable).", "s",
         [(quantile(0.95, "vllm:time_to_first_token_seconds", BY_SVC), f"p95 {SVC_LEGEND}"),
          ("vector($ttft_slo)", "SLO target")], "timeseries"),
        ("Inter-token latency p95 against the SLO", "Inter-token latency p95 over all replicas (autoscaling "
         "metric inter_token_latency_p95_seconds) and the SLO target ($itl_slo s).", "s",
         [(quantile(0.95, "vllm:inter_token_latency_seconds", BY_SVC), f"p95 {SVC_LEGEND}"),
          ("vector($itl_slo)", "SLO target")], "timeseries"),
        ("Replicas serving", "Engine pods answering scrapes: watch them follow the p95 when autoscaling is on "
         "an SLO.", "none", [(f"sum by ({BY_SVC}) (up{{{TARGET}}})", SVC_LEGEND)], "timeseries"),
    ]),
    ("Latency (per InferenceService)", [
        ("Time to first token", "TTFT percentiles: arrival to the first output token.", "s",
         percentiles("vllm:time_to_first_token_seconds"), "timeseries"),
        ("Inter-token latency", "Time between consecutive output tokens of a request (ITL, TPOT).", "s",
         percentiles("vllm:inter_token_latency_seconds"), "timeseries"),
        ("End-to-end request latency", "Arrival to the last output token.", "s",
         percentiles("vllm:e2e_request_latency_seconds"), "timeseries"),
        ("Queue time", "Time a request waited before it was first scheduled (p50, p95).", "s",
         [(quantile(0.5, "vllm:request_queue_time_seconds", BY_SVC), f"p50 {SVC_LEGEND}"),
          (quantile(0.95, "vllm:request_queue_time_seconds", BY_SVC), f"p95 {SVC_LEGEND}")], "timeseries"),
    ]),
    ("KV cache and scheduling (per InferenceService)", [
        ("KV-cache usage by pod", "Fraction of each pod's KV blocks in use; near 1, requests are preempted.",
         "percentunit", [(gauge("vllm:kv_cache_usage_perc", BY_POD, "max"), f"{POD_LEGEND} {SVC_LEGEND}")],
         "timeseries"),
        ("Prefix-cache hit rate", "Prompt tokens found in the prefix cache / prompt tokens looked up.",
         "percentunit", [(f"{rate('vllm:prefix_cache_hits_total', BY_SVC)} / "
                          f"{rate('vllm:prefix_cache_queries_total', BY_SVC)}", SVC_LEGEND)], "timeseries"),
        ("Preemptions/s", "Requests preempted (KV freed, recomputed later) per second: the KV cache is too small "
         "for the batch.", "short", [(rate("vllm:num_preemptions_total", BY_SVC), SVC_LEGEND)], "timeseries"),
        ("Finished requests by reason", "stop (EOS or a stop string), length (max_tokens), abort.", "reqps",
         [(rate("vllm:request_success_total", f"{BY_SVC}, finished_reason"),
           "{{finished_reason}} " + SVC_LEGEND)], "timeseries"),
    ]),
    ("Per pod", [
        ("Generation tokens/s by pod", "Output tokens per second of each engine pod.", "short",
         [(rate("vllm:generation_tokens_total", BY_POD), POD_LEGEND)], "timeseries"),
        ("Running and waiting by pod", "Each pod's running batch and queue.", "short",
         [(gauge("vllm:num_requests_running", BY_POD), f"running {POD_LEGEND}"),
          (gauge("vllm:num_requests_waiting", BY_POD), f"waiting {POD_LEGEND}")], "timeseries"),
        ("Time to first token p95 by pod", "TTFT p95 of each pod.", "s",
         [(quantile(0.95, "vllm:time_to_first_token_seconds", BY_POD), POD_LEGEND)], "timeseries"),
        ("Inter-token latency p95 by pod", "ITL p95 of each pod.", "s",
         [(quantile(0.95, "vllm:inter_token_latency_seconds", BY_POD), POD_LEGEND)], "timeseries"),
    ]),
]


def variable(name: str, label: str, query: str) -> dict:
    """A multi-value query variable over label values, `All` matching everything."""
    return {"type": "query", "name": name, "label": label, "datasource": DS, "definition": query,
            "query": {"query": query, "refId": f"{name}-values"}, "refresh": 2, "sort": 1,
            "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0}


def textbox(name: str, label: str, value: str) -> dict:
    """A free-text variable with a default (an SLO target, in seconds)."""
    return {"type": "textbox", "name": name, "label": label, "query": value,
            "current": {"text": value, "value": value}, "hide": 0}


def variables() -> list[dict]:
    m = "vllm:num_requests_running"
    return [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        variable("namespace", "Namespace", f"label_values({m}, namespace)"),
        variable("inferenceservice", "InferenceService",
                 f'label_values({m}{{namespace=~"$namespace"}}, {ISVC})'),
        variable("model", "Model", f'label_values({m}{{namespace=~"$namespace", {ISVC}=~"$inferenceservice"}}, '
                                   "model_name)"),
        variable("pod", "Pod", f'label_values({m}{{namespace=~"$namespace", {ISVC}=~"$inferenceservice", '
                               'model_name=~"$model"}, pod)'),
        textbox("ttft_slo", "TTFT p95 SLO (s)", "0.5"),
        textbox("itl_slo", "Inter-token p95 SLO (s)", "0.1"),
    ]


def panel(pid: int, title: str, description: str, unit: str, targets: list[tuple[str, str]], kind: str,
          grid: dict) -> dict:
    p = {"id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
         "gridPos": grid,
         "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                     for i, (expr, legend) in enumerate(targets)],
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}
    if unit == "percentunit":
        p["fieldConfig"]["defaults"].update(min=0, max=1)
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "value_and_name"}
    else:
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
        p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                  "showPoints": "never"}
    return p


def dashboard() -> dict:
    panels, pid, y, h_prev = [], 1, 0, 0
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        x = 0
        for title, description, unit, targets, kind in row:
            w, h = (6, 4) if kind == "stat" else (12, 8)
            if x + w > 24:
                x, y = 0, y + h_prev
            panels.append(panel(pid, title, description, unit, targets, kind, {"h": h, "w": w, "x": x, "y": y}))
            pid, x, h_prev = pid + 1, x + w, h
        y += h_prev
    return {
        "uid": UID, "title": "Flotilla / LLM serving",
        "description": "Flotilla engines by InferenceService and pod: latency, throughput, queue, KV cache "
                       "(vLLM metric names). Generated by charts/flotilla/dashboards/generate.py.",
        "tags": ["flotilla", "vllm", "llm"], "editable": True, "graphTooltip": 1, "refresh": "30s",
        "schemaVersion": 39, "version": 1, "time": {"from": "now-1h", "to": "now"}, "timezone": "",
        "annotations": {"list": []}, "links": [], "templating": {"list": variables()}, "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if flotilla.json differs from the code")
    args = parser.parse_args()
    if args.check:
        if not OUT.exists() or OUT.read_text() != render():
            print(f"{OUT} is stale: run python3 {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

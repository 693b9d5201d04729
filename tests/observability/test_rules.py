"""The alert and recording rules with promtool (check + unit tests on synthetic series), the dashboard
generator, and the chart templates that ship both."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import DASHBOARD, REPO, RULES

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus)")
RULE_GROUPS = yaml.safe_load(RULES.read_text())["groups"]
ALERTS = {r["alert"]: r for g in RULE_GROUPS for r in g["rules"] if "alert" in r}
SVC = 'namespace="demo", serving_flotilla_dev_inferenceservice="{svc}", model_name="{svc}"'


def series(metric: str, svc: str, values: str, **extra: str) -> dict[str, str]:
    labels = SVC.format(svc=svc) + "".join(f', {k}="{v}"' for k, v in extra.items())
    return {"series": f"{metric}{{{labels}}}", "values": values}


def fired(alert: str, summary: str, description: str | None = None, **labels: str) -> dict[str, Any]:
    """An expected alert: its labels, and its annotations (runbook lines as written in the rules)."""
    rule = ALERTS[alert]
    annotations = {**rule["annotations"], "summary": summary}
    if description is not None:
        annotations["description"] = description
    return {"exp_labels": {**rule["labels"], "namespace": "demo", **labels}, "exp_annotations": annotations}


def ttft(svc: str, fast_per_min: int, total_per_min: int, minutes: int) -> list[dict[str, str]]:
    """TTFT histogram counters: `fast_per_min` of `total_per_min` requests within 2.5 s."""
    return [series("vllm:time_to_first_token_seconds_bucket", svc, f"0+{fast_per_min}x{minutes}", le="2.5"),
            series("vllm:time_to_first_token_seconds_bucket", svc, f"0+{total_per_min}x{minutes}", le="+Inf"),
            series("vllm:time_to_first_token_seconds_count", svc, f"0+{total_per_min}x{minutes}")]


# One case per alert: series that must fire it (with its labels and rendered annotations), next to
# series of a healthy InferenceService that must not.
CASES: dict[str, dict[str, Any]] = {
    "FlotillaQueueGrowing": {
        # Grows 2 a minute to 50 at 25m, then holds: the alert (on a recorded series, which promtool may
        # evaluate before or after the recording group) reads 50 either way at 30m.
        "input_series": [series("vllm:num_requests_waiting", "llama", "0+2x25 50x35", pod="llama-a"),
                         series("vllm:num_requests_waiting", "steady", "20x60", pod="steady-a")],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "FlotillaQueueGrowing", "exp_alerts": [fired(
                "FlotillaQueueGrowing", "demo/llama: 50 requests waiting and the queue keeps growing",
                serving_flotilla_dev_inferenceservice="llama", model_name="llama")]},
            {"eval_time": "12m", "alertname": "FlotillaQueueGrowing", "exp_alerts": []},  # growing, not for 10m yet
        ]},
    "FlotillaKVCacheNearFull": {
        "input_series": [series("vllm:kv_cache_usage_perc", "llama", "0.97x30", pod="llama-a"),
                         series("vllm:kv_cache_usage_perc", "llama", "0.5x30", pod="llama-b")],
        "alert_rule_test": [{"eval_time": "15m", "alertname": "FlotillaKVCacheNearFull", "exp_alerts": [fired(
            "FlotillaKVCacheNearFull", "demo/llama-a: KV cache 97% full for 10 minutes",
            serving_flotilla_dev_inferenceservice="llama", model_name="llama", pod="llama-a")]}]},
    "FlotillaPreemptionStorm": {
        "input_series": [series("vllm:num_preemptions_total", "llama", "0+30x30", pod="llama-a"),
                         series("vllm:num_preemptions_total", "calm", "0+3x30", pod="calm-a")],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "FlotillaPreemptionStorm", "exp_alerts": [fired(
            "FlotillaPreemptionStorm", "demo/llama: 0.50 preemptions/s",
            serving_flotilla_dev_inferenceservice="llama", model_name="llama")]}]},
    "FlotillaTTFTSLOBurnFast": {
        "input_series": ttft("llama", 10, 100, 90) + ttft("qwen", 50, 100, 90) + ttft("ok", 99, 100, 90),
        "alert_rule_test": [{"eval_time": "80m", "alertname": "FlotillaTTFTSLOBurnFast", "exp_alerts": [fired(
            "FlotillaTTFTSLOBurnFast", "demo/llama: TTFT SLO error budget burning 14x too fast",
            "Over the last hour (and the last 5 minutes) 90% of requests waited more than 2.5 s for their first "
            "token; at this rate the 30-day budget of the 95% TTFT SLO is gone in about 2 days.",
            serving_flotilla_dev_inferenceservice="llama", model_name="llama")]}]},
    "FlotillaTTFTSLOBurnSlow": {
        "input_series": ttft("llama", 10, 100, 90) + ttft("qwen", 50, 100, 90) + ttft("ok", 99, 100, 90),
        "alert_rule_test": [{"eval_time": "80m", "alertname": "FlotillaTTFTSLOBurnSlow", "exp_alerts": [
            fired("FlotillaTTFTSLOBurnSlow", f"demo/{svc}: TTFT SLO error budget burning 6x too fast",
                  f"Over the last 6 hours (and the last 30 minutes) {pct} of requests waited more than 2.5 s for "
                  "their first token; at this rate the 30-day budget of the 95% TTFT SLO is gone in 5 days.",
                  serving_flotilla_dev_inferenceservice=svc, model_name=svc)
            for svc, pct in (("llama", "90%"), ("qwen", "50%"))]}]},
    "FlotillaNoReadyReplicas": {
        "input_series": [
            {"series": 'up{namespace="demo", serving_flotilla_dev_inferenceservice="down", pod="down-a"}',
             "values": "0x30"},
            {"series": 'up{namespace="demo", serving_flotilla_dev_inferenceservice="down", pod="down-b"}',
             "values": "0x30"},
            {"series": 'up{namespace="demo", serving_flotilla_dev_inferenceservice="gone", pod="gone-a"}',
             "values": "1x10 stale"},
            {"series": 'up{namespace="demo", serving_flotilla_dev_inferenceservice="half", pod="half-a"}',
             "values": "0x30"},
            {"series": 'up{namespace="demo", serving_flotilla_dev_inferenceservice="half", pod="half-b"}',
             "values": "1x30"}],
        "alert_rule_test": [{"eval_time": "25m", "alertname": "FlotillaNoReadyReplicas", "exp_alerts": [
            fired("FlotillaNoReadyReplicas", f"demo/{svc}: no engine replica is serving",
                  serving_flotilla_dev_inferenceservice=svc) for svc in ("down", "gone")]}]},
}


def test_every_alert_has_a_unit_test_and_a_runbook() -> None:
    assert set(CASES) == set(ALERTS)
    for name, rule in ALERTS.items():
        assert rule["annotations"]["runbook"].strip(), name
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower().removesuffix("fast").removesuffix(
            "slow")), name
        assert rule["labels"]["severity"] in ("warning", "critical")
    docs = (REPO / "docs" / "observability.md").read_text()
    for name, rule in ALERTS.items():
        assert name in docs and rule["annotations"]["runbook"] in docs, f"docs/observability.md lacks {name}"


@needs_promtool
def test_promtool_check_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_unit_tests_for_every_alert(tmp_path: Path) -> None:
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
             "tests": [{"name": name, "interval": "1m", **case} for name, case in CASES.items()]}
    # Recording rules on synthetic series too: p95 TTFT and tokens/s by InferenceService.
    tests["tests"].append({
        "name": "recording", "interval": "1m",
        "input_series": [series("vllm:generation_tokens_total", "llama", "0+600x20", pod="llama-a"),
                         series("vllm:generation_tokens_total", "llama", "0+1200x20", pod="llama-b"),
                         *ttft("llama", 100, 100, 20)],
        "promql_expr_test": [
            {"expr": "inferenceservice:vllm_generation_tokens:rate5m", "eval_time": "10m",
             "exp_samples": [{"labels": "inferenceservice:vllm_generation_tokens:rate5m{" + SVC.format(svc="llama")
                              + "}", "value": 30}]},
            {"expr": "inferenceservice:vllm_time_to_first_token_seconds:p95_5m", "eval_time": "10m",
             "exp_samples": [{"labels": "inferenceservice:vllm_time_to_first_token_seconds:p95_5m{"
                              + SVC.format(svc="llama") + "}", "value": 2.375}]},
        ]})
    # The SLO autoscaling series: p95 over 1m, and 0 (not NaN) for an InferenceService with no traffic.
    tests["tests"].append({
        "name": "slo", "interval": "15s",
        "input_series": [*ttft("llama", 25, 25, 80), *ttft("idle", 0, 0, 80)],
        "promql_expr_test": [
            {"expr": "inferenceservice:vllm_time_to_first_token_seconds:p95_1m", "eval_time": "10m",
             "exp_samples": [{"labels": "inferenceservice:vllm_time_to_first_token_seconds:p95_1m{"
                              + SVC.format(svc="llama") + "}", "value": 2.375},
                             {"labels": "inferenceservice:vllm_time_to_first_token_seconds:p95_1m{"
                              + SVC.format(svc="idle") + "}", "value": 0}]},
        ]})
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_json_is_what_the_generator_makes() -> None:
    done = subprocess.run(["python3", str(DASHBOARD.with_name("generate.py")), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    titles = " ".join(p["title"] for p in panels)
    for needed in ("Time to first token", "Inter-token latency", "End-to-end", "tokens/s", "running and waiting",
                   "KV-cache usage", "Prefix-cache hit rate", "Preemptions", "by pod"):
        assert needed in titles, needed
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace", "inferenceservice",
                                                                    "model", "pod", "ttft_slo", "itl_slo"}
    for p in panels:
        for t in p["targets"]:
            if t["expr"].startswith("vector($"):
                continue  # an SLO target line, from a dashboard variable
            up = t["expr"].startswith("sum by (namespace, serving_flotilla_dev_inferenceservice) (up{")
            assert 'model_name=~"$model"' in t["expr"] or up
            assert 'namespace=~"$namespace"' in t["expr"] and 'inferenceservice=~"$inferenceservice"' in t["expr"]


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    helm_python = pytest.importorskip("helm_python")
    with helm_python.Chart.load(REPO / "charts" / "flotilla") as chart:
        rendered = chart.render(values, name="flotilla", namespace="monitoring", is_install=True)
    return [d for path, text in rendered.items() if "observability-" in path for d in yaml.safe_load_all(text) if d]


def test_chart_ships_the_dashboard_and_the_rules_unchanged() -> None:
    objects = _render({"observability": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}})
    by_kind = {o["kind"]: o for o in objects}
    dashboard = by_kind["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["flotilla.json"]) == json.loads(DASHBOARD.read_text())
    rule = by_kind["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_chart_defaults_dashboard_on_rules_off() -> None:
    assert [o["kind"] for o in _render({})] == ["ConfigMap"]
    off = {"observability": {"dashboard": {"enabled": False}, "prometheusRule": {"enabled": False}}}
    assert _render(off) == []

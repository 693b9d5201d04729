"""Every dashboard query, every recording rule and both autoscaler queries, on a real Prometheus
scraping a real engine under load (fixtures in conftest.py)."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import pytest
import yaml

from flotilla.operator.autoscaling import build_hpa, keda_query
from flotilla.operator.spec import InferenceServiceSpec

from .conftest import DASHBOARD, ISVC_LABEL, MODEL, NAMESPACE, OTHER, PODS, REPO, RULES, SERVICE, Observed

pytestmark = pytest.mark.slow

DASH = json.loads(DASHBOARD.read_text())
TARGETS = [(p["title"], t) for p in DASH["panels"] if p["type"] != "row" for t in p["targets"]]
RECORDS = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r]
SERVICE_PODS = sorted(p for p, s in PODS.items() if s == SERVICE)
# Values a user picks in the dashboard's variables: everything, or one InferenceService / pod.
SELECTIONS = {
    "all": {"namespace": ".*", "inferenceservice": ".*", "model": ".*", "pod": ".*", "ttft_slo": "0.5",
            "itl_slo": "0.1"},
    "one": {"namespace": NAMESPACE, "inferenceservice": SERVICE, "model": MODEL, "pod": SERVICE_PODS[0],
            "ttft_slo": "0.5", "itl_slo": "0.1"},
}


def substitute(expr: str, selection: dict[str, str], since: float) -> str:
    """What Grafana sends: variables replaced, and $__rate_interval (Grafana's: 4 x the 1 s scrape interval, plus
    margin) at least the fixture's whole traffic, back to `since`: a fixed window can hold fewer than the two
    samples rate() needs when a loaded machine stretches the time between the scrapes and the queries."""
    expr = expr.replace("$__rate_interval", f"{max(30, math.ceil(time.time() - since) + 1)}s")
    for name, value in selection.items():
        expr = expr.replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
@pytest.mark.parametrize(("title", "target"), TARGETS, ids=[f"{t}-{x['refId']}" for t, x in TARGETS])
def test_dashboard_query_returns_labelled_series(observed: Observed, title: str, target: dict[str, Any],
                                                 selection: str) -> None:
    picked = SELECTIONS[selection]
    expr = substitute(target["expr"], picked, observed.since)
    result = observed.prometheus.query(expr)
    assert result, f"{title}: no series for {expr}"
    by = re.findall(r"by \(([^)]*)\)", expr)
    grouped = {label.strip() for clause in by for label in clause.split(",")} - {"le"}
    for series in result:
        labels = series["metric"]
        assert legend_labels(target["legendFormat"]) <= labels.keys(), (title, labels)
        assert grouped <= labels.keys(), (title, labels)
        if selection == "one":  # the variables really filter
            assert labels.get("namespace", NAMESPACE) == NAMESPACE
            assert labels.get(ISVC_LABEL, SERVICE) == SERVICE
            assert labels.get("pod", picked["pod"]) == picked["pod"]
        value = float(series["value"][1])
        assert not math.isinf(value), (title, series)


def test_dashboard_variables_list_what_was_scraped(observed: Observed) -> None:
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    expected = {"namespace": {NAMESPACE}, "inferenceservice": {SERVICE, OTHER}, "model": {MODEL},
                "pod": set(PODS)}
    for name, values in expected.items():
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["query"]["query"])
        assert match, variables[name]
        series, label = substitute(match[1], SELECTIONS["all"], observed.since), match[2]
        assert observed.prometheus.series_labels(series, label) == values, name


@pytest.mark.parametrize("rule", RECORDS, ids=[r["record"] for r in RECORDS])
def test_recording_rule_has_series_by_inferenceservice(observed: Observed, rule: dict[str, Any]) -> None:
    result = observed.prometheus.query(rule["record"])
    assert result, f"{rule['record']} recorded nothing"
    services = {s["metric"][ISVC_LABEL] for s in result}
    assert services == {SERVICE, OTHER}, services
    for series in result:
        assert series["metric"]["namespace"] == NAMESPACE
        if not rule["record"].startswith("inferenceservice:up:"):
            assert series["metric"]["model_name"] == MODEL
        value = float(series["value"][1])
        assert math.isfinite(value) and value >= 0, series


def test_recorded_values_match_the_raw_series(observed: Observed) -> None:
    p = observed.prometheus
    # The recorded sample and the raw series at the rule's own evaluation time: the same figure (a
    # scrape landing between the evaluation and our query can differ, so retry a few times).
    for _ in range(20):
        recorded = p.query(f'timestamp(inferenceservice:vllm_kv_cache_usage_perc:max{{{ISVC_LABEL}="{SERVICE}"}})')
        at = float(recorded[0]["value"][1])
        kv_max = float(p.query(f'inferenceservice:vllm_kv_cache_usage_perc:max{{{ISVC_LABEL}="{SERVICE}"}}', at)[0]
                       ["value"][1])
        raw = {s["metric"]["pod"]: float(s["value"][1]) for s in p.query("vllm:kv_cache_usage_perc", at)}
        if kv_max == max(raw[pod] for pod in SERVICE_PODS):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"recorded KV max {kv_max} never matched the raw series {raw}")
    assert 0 <= kv_max <= 1
    up = {s["metric"][ISVC_LABEL]: float(s["value"][1]) for s in p.query("inferenceservice:up:sum")}
    assert up == {SERVICE: 2.0, OTHER: 1.0}


# --- the autoscalers' queries -------------------------------------------------------------------------

AUTOSCALED = InferenceServiceSpec.model_validate({
    "model": {"source": "pvc://models/smollm2"},
    "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "metric": "num_requests_waiting", "target": 2},
})


def _steady_waiting(observed: Observed) -> tuple[float, dict[str, float]]:
    """A time at which every target's vllm:num_requests_waiting sample is > 0, and those samples."""
    p = observed.prometheus
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        at = time.time() - 2
        raw = {s["metric"]["pod"]: float(s["value"][1]) for s in p.query("vllm:num_requests_waiting", at)}
        if len(raw) == len(PODS) and all(v > 0 for v in raw.values()):
            return at, raw
        time.sleep(0.5)
    raise AssertionError(f"the load never queued requests on every target: {raw}")


def test_keda_query_sums_the_services_pods(observed: Observed) -> None:
    at, raw = _steady_waiting(observed)
    query = keda_query(AUTOSCALED, SERVICE, NAMESPACE)
    result = observed.prometheus.query(query, at)
    assert len(result) == 1, result
    got = float(result[0]["value"][1])
    assert got == sum(raw[pod] for pod in SERVICE_PODS)  # the other InferenceService is left out
    # KEDA (metricType AverageValue) divides by the current replicas: the HPA then wants this many.
    threshold = float(AUTOSCALED.autoscaling.target)
    replicas = len(SERVICE_PODS)
    desired = math.ceil(replicas * (got / replicas) / threshold)
    assert desired == math.ceil(got / threshold) >= 1
    assert 0 < got <= (8 - 4) * 2 * 2  # waiting per engine <= clients - max_num_seqs, twice over


def _adapter_rules() -> list[dict[str, Any]]:
    """The Prometheus Adapter rules the chart ships (rendered), else the one autoscaling.py documents."""
    chart = REPO / "charts" / "flotilla"
    try:
        import helm_python

        with helm_python.Chart.load(chart) as c:
            rendered = c.render({"prometheusAdapter": {"rules": {"enabled": True}}}, name="flotilla",
                                namespace="flotilla", is_install=True)
        for path, text in rendered.items():
            for doc in yaml.safe_load_all(text) if path.endswith(".yaml") else []:
                if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
                    return yaml.safe_load(doc["data"]["config.yaml"])["rules"]
    except (ImportError, FileNotFoundError):
        pass
    return [{"seriesQuery": 'vllm:num_requests_waiting{namespace!="",pod!=""}',
             "name": {"as": "vllm:num_requests_waiting"},
             "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}]


def test_prometheus_adapter_rule_gives_the_hpa_its_per_pod_values(observed: Observed) -> None:
    hpa = build_hpa(AUTOSCALED, SERVICE, NAMESPACE)
    assert hpa is not None
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]  # vllm:num_requests_waiting
    rules = [r for r in _adapter_rules() if r["name"].get("as") == metric]
    assert len(rules) == 1, f"no adapter rule exposes {metric}"
    rule = rules[0]
    series = rule["seriesQuery"].split("{")[0]
    assert observed.prometheus.series_labels(rule["seriesQuery"], "pod") == set(PODS)
    at, raw = _steady_waiting(observed)
    # What the adapter sends for `kubectl get --raw .../namespaces/demo/pods/*/vllm:num_requests_waiting`
    # over the HPA's pods (selected by the InferenceService's pod labels).
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(SERVICE_PODS)}"'
    query = (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
             .replace("<<.GroupBy>>", "pod"))
    per_pod = {s["metric"]["pod"]: float(s["value"][1]) for s in observed.prometheus.query(query, at)}
    assert per_pod == {pod: raw[pod] for pod in SERVICE_PODS}
    # The HPA averages them (AverageValue) against the target.
    average = sum(per_pod.values()) / len(per_pod)
    target = float(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
    assert math.ceil(len(per_pod) * average / target) == math.ceil(sum(raw[p] for p in SERVICE_PODS) / target)


def _adapter_external_rules() -> list[dict[str, Any]]:
    helm_python = pytest.importorskip("helm_python")
    with helm_python.Chart.load(REPO / "charts" / "flotilla") as c:
        rendered = c.render({"prometheusAdapter": {"rules": {"enabled": True}}}, name="flotilla",
                            namespace="flotilla", is_install=True)
    for path, text in rendered.items():
        for doc in yaml.safe_load_all(text) if path.endswith(".yaml") else []:
            if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
                return yaml.safe_load(doc["data"]["config.yaml"])["externalRules"]
    raise AssertionError("the chart rendered no adapter ConfigMap")


@pytest.mark.parametrize("metric", ["ttft_p95_seconds", "inter_token_latency_p95_seconds"])
def test_adapter_external_rule_gives_the_slo_hpa_the_services_p95(observed: Observed, metric: str) -> None:
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "pvc://models/smollm2"},
        "autoscaling": {"maxReplicas": 8, "metric": metric, "target": 0.5}})
    hpa = build_hpa(spec, SERVICE, NAMESPACE)
    assert hpa is not None
    external = hpa["spec"]["metrics"][0]["external"]["metric"]
    rules = [r for r in _adapter_external_rules() if r["name"]["as"] == external["name"]]
    assert len(rules) == 1, f"no adapter external rule serves {external['name']}"
    series = rules[0]["seriesQuery"].split("{")[0]
    # What the adapter sends for the HPA's External metric in namespace demo with its selector.
    matchers = ",".join([f'namespace="{NAMESPACE}"',
                         *(f'{k}="{v}"' for k, v in external["selector"]["matchLabels"].items())])
    query = (rules[0]["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
             .replace("<<.GroupBy>>", ""))
    result = observed.prometheus.query(query)
    assert len(result) == 1, (query, result)
    value = float(result[0]["value"][1])
    recorded = {s["metric"][ISVC_LABEL]: float(s["value"][1]) for s in observed.prometheus.query(series)}
    assert recorded.keys() == {SERVICE, OTHER}  # the other InferenceService is there, and left out above
    assert math.isfinite(value) and value > 0

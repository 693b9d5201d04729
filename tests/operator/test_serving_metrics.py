"""Serving figures from /metrics text (operator/serving_metrics.py) and the status block built from
them (operator/serving_status.py): pure functions, on bodies written by prometheus_client as the
engine writes them."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from flotilla.operator import serving_metrics as sm
from flotilla.operator.engine_pods import engine_pods
from flotilla.operator.serving_reader import MAX_BODY_BYTES, MAX_WANTED_LINES, targets_of, wanted_lines
from flotilla.operator.serving_status import Thresholds, as_merge_patch, build_serving, worth_writing

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0]


class FakeEngine:
    """An engine's metrics, with vLLM's names, labels and buckets (a subset), and other series besides."""

    def __init__(self, models: tuple[str, ...] = ("m",)):
        r, labels = CollectorRegistry(), ["model_name"]
        self.models = models
        self.registry = r
        self.running = Gauge("vllm:num_requests_running", "", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", labels, registry=r)
        self.tokens = Counter("vllm:generation_tokens", "", labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "", labels, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "", labels, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "", labels, buckets=ITL_BUCKETS, registry=r)
        Histogram("vllm:e2e_request_latency_seconds", "", labels, registry=r).labels("m").observe(3)
        for m in models:
            for metric in (self.running, self.waiting, self.kv):
                metric.labels(m).set(0)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_parse_reads_gauges_counters_and_histograms_summed_over_models():
    e = FakeEngine(("a", "b"))
    e.running.labels("a").set(3)
    e.running.labels("b").set(1)
    e.waiting.labels("a").set(5)
    e.kv.labels("a").set(0.5)
    e.kv.labels("b").set(0.3)
    e.tokens.labels("a").inc(100)
    for v in (0.03, 0.3, 3.0):
        e.ttft.labels("a").observe(v)
    s = sm.parse(wanted_lines(e.text()), at=1.0)
    assert s.values[sm.RUNNING] == 4 and s.values[sm.WAITING] == 5
    assert s.values[sm.KV_USAGE] == pytest.approx(0.4)  # the pod's mean over its models
    assert s.values[sm.GENERATION_TOKENS] == 100
    assert dict(s.ttft)[0.04] == 1 and dict(s.ttft)[0.5] == 2 and dict(s.ttft)[math.inf] == 3
    assert s.itl == ()  # no request yet: no labelled series, nothing to parse


def test_parse_refuses_what_is_not_an_engine():
    with pytest.raises(sm.MetricsFormatError):
        sm.parse("up 1\n", 0)
    with pytest.raises(sm.MetricsFormatError):
        sm.parse("this is { not prometheus\n", 0)


def test_wanted_lines_parse_at_most_their_limit_and_skip_the_rest_cheaply():
    # The engine image is its author's: a /metrics of 72 000 TTFT buckets took the operator 2 s of CPU to parse, and
    # 4 MiB of empty lines 0.7 s to filter, each period on the event loop that answers the admission webhooks.
    head = "vllm:num_requests_running 1\r\nvllm:num_requests_waiting 0\r\n# HELP x\r\nother 1\r\n"
    buckets = [f'vllm:time_to_first_token_seconds_bucket{{le="{i}"}} {i}\r\n' for i in range(MAX_WANTED_LINES)]
    at_limit = wanted_lines(head + "".join(buckets[:-2]))
    assert at_limit.count("\n") == MAX_WANTED_LINES and "\r" not in at_limit and "other" not in at_limit
    assert len(sm.parse(at_limit, 0).ttft) == MAX_WANTED_LINES - 2
    with pytest.raises(sm.MetricsFormatError, match=f"more than {MAX_WANTED_LINES} samples"):
        wanted_lines(head + "".join(buckets[:-1]))
    assert wanted_lines("\n" * MAX_BODY_BYTES) == "\n"


def test_histogram_quantile_matches_promql():
    # Cumulative: 10 <= 0.1, 50 <= 0.5, 100 <= 1, 100 total. PromQL: rank 95 falls in (0.5, 1]:
    # 0.5 + 0.5 * (95 - 50) / (100 - 50) = 0.95; rank 50 is the top of (0.1, 0.5] = 0.5.
    buckets = ((0.1, 10.0), (0.5, 50.0), (1.0, 100.0), (math.inf, 100.0))
    assert sm.histogram_quantile(0.95, buckets) == pytest.approx(0.95)
    assert sm.histogram_quantile(0.5, buckets) == pytest.approx(0.5)
    assert sm.histogram_quantile(0.05, buckets) == pytest.approx(0.05)  # lowest bucket starts at 0
    # Rank in +Inf: the highest finite bound; nothing observed: unknown.
    assert sm.histogram_quantile(0.95, ((1.0, 1.0), (math.inf, 10.0))) == 1.0
    assert sm.histogram_quantile(0.95, ((1.0, 0.0), (math.inf, 0.0))) is None


def _scrape(e: FakeEngine, at: float) -> sm.Scrape:
    return sm.parse(e.text(), at)


def test_window_figures_are_rates_and_quantiles_of_the_increase():
    e = FakeEngine()
    for _ in range(10):
        e.ttft.labels("m").observe(5.0)  # before the window: must not count
    e.tokens.labels("m").inc(1000)
    first = _scrape(e, 100.0)
    e.tokens.labels("m").inc(600)
    e.queries.labels("m").inc(200)
    e.hits.labels("m").inc(50)
    for v in [0.03] * 19 + [0.7]:
        e.ttft.labels("m").observe(v)
    e.itl.labels("m").observe(0.02)
    e.running.labels("m").set(4)
    e.waiting.labels("m").set(2)
    e.kv.labels("m").set(0.25)
    f = sm.figures([sm.Window(first, _scrape(e, 160.0))])
    assert (f.running, f.waiting, f.kv_cache_usage) == (4, 2, 0.25)
    assert f.generation_tokens_per_second == pytest.approx(10.0)
    assert f.prefix_cache_hit_rate == pytest.approx(0.25)
    # 20 observations: rank 19 is the 19th 0.03 in (0.02, 0.04]: 0.02 + 0.02 * 19/19 = 0.04.
    assert f.ttft_p95_seconds == pytest.approx(0.04)
    assert f.ttft_p50_seconds == pytest.approx(0.02 + 0.02 * 10 / 19)
    assert f.inter_token_latency_p95_seconds == pytest.approx(0.01 + 0.015 * 0.95)


def test_no_earlier_scrape_or_no_traffic_gives_unknown_rates():
    e = FakeEngine()
    only = sm.figures([sm.Window(None, _scrape(e, 1.0))])
    assert only.generation_tokens_per_second is None and only.ttft_p95_seconds is None
    idle = sm.figures([sm.Window(_scrape(e, 1.0), _scrape(e, 2.0))])
    assert idle.generation_tokens_per_second == 0 and idle.ttft_p95_seconds is None
    assert idle.prefix_cache_hit_rate is None


def test_a_restarted_engine_counts_from_zero():
    e = FakeEngine()
    e.tokens.labels("m").inc(5000)
    e.ttft.labels("m").observe(0.03)
    before = _scrape(e, 0.0)
    fresh = FakeEngine()
    fresh.tokens.labels("m").inc(100)
    fresh.ttft.labels("m").observe(2.0)
    f = sm.figures([sm.Window(before, _scrape(fresh, 10.0))])
    assert f.generation_tokens_per_second == pytest.approx(10.0)
    assert 1.0 < f.ttft_p95_seconds <= 2.5


def test_totals_sum_buckets_across_replicas_before_the_quantile():
    fast, slow = FakeEngine(), FakeEngine()
    windows = []
    for e, value, n in ((fast, 0.03, 90), (slow, 3.0, 10)):
        start = _scrape(e, 0.0)
        for _ in range(n):
            e.ttft.labels("m").observe(value)
        e.tokens.labels("m").inc(n)
        e.kv.labels("m").set(n / 100)
        windows.append(sm.Window(start, _scrape(e, 10.0)))
    total = sm.figures(windows)
    assert total.generation_tokens_per_second == pytest.approx(10.0)
    assert total.kv_cache_usage == pytest.approx(0.5)
    # 100 requests, 10 slow: rank 95 is the 5th of the slow ones in (2.5, 5]: 2.5 + 2.5 * 5/10.
    assert total.ttft_p95_seconds == pytest.approx(3.75)
    assert sm.figures(windows[:1]).ttft_p95_seconds < 0.05


def test_window_of_starts_at_the_oldest_scrape_inside_the_window():
    e = FakeEngine()
    history = [_scrape(e, t) for t in (0.0, 10.0, 20.0, 70.0)]
    assert sm.window_of(history, 60).first.at == 10.0
    assert sm.window_of(history[:1], 60).first is None


def _block(**total: float) -> dict:
    figures = sm.Figures(running=int(total.get("running", 1)), waiting=int(total.get("waiting", 0)),
                         kv_cache_usage=total.get("kv", 0.4), prefix_cache_hit_rate=None,
                         generation_tokens_per_second=total.get("tps", 100.0), ttft_p50_seconds=0.1,
                         ttft_p95_seconds=total.get("ttft", 0.5), inter_token_latency_p95_seconds=0.05)
    return build_serving(figures, {"pod-a": figures}, 60.0, "2026-12-03T10:00:00Z")


def test_status_block_is_rounded_camel_case_with_replicas():
    block = _block(kv=0.41234, ttft=0.51234)
    assert block["kvCacheUsagePercent"] == 41.2 and block["ttftP95Seconds"] == 0.512
    assert "prefixCacheHitRatePercent" not in block  # unknown figures are left out
    assert block["replicas"][0]["pod"] == "pod-a" and block["scraped"] == 1 and block["windowSeconds"] == 60


@pytest.mark.parametrize(("change", "written"), [
    ({}, False), ({"tps": 105.0}, False), ({"kv": 0.41}, False),
    ({"waiting": 1}, True), ({"tps": 120.0}, True), ({"kv": 0.45}, True), ({"ttft": 0.6}, True),
])
def test_status_is_written_only_when_a_figure_moves_enough(change, written):
    t = Thresholds()
    assert worth_writing(_block(), _block(**change), age_s=1.0, thresholds=t) is written
    assert worth_writing(_block(), _block(**change), age_s=t.max_age_s, thresholds=t)  # stale: always
    assert worth_writing(None, _block(), age_s=0, thresholds=t)


def _pod(name, phase="Running", ip="10.0.0.1", ns="a", port=8000, label="svc", owner="rs-svc", host_network=False,
         kind="ReplicaSet", controller=True):
    """A pod as the apiserver lists it: by default one that Deployment svc's ReplicaSet (uid rs-svc) made."""
    labels = {"serving.flotilla.dev/inferenceservice": label, "pod-template-hash": "5d9f"}
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": "svc-5d9f", "uid": owner, "controller": controller}
    refs = [ref] if owner else []
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": refs},
            "spec": {"hostNetwork": host_network,
                     "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": phase, "podIP": ip}}


def _replicaset(uid, deployment_uid, ns="a", name="svc-5d9f"):
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "svc", "uid": deployment_uid, "controller": True}]}}


# Deployment svc's ReplicaSet; one named alike that another Deployment controls (its author's, made so that
# Deployment svc does not adopt it); the uid of Deployment svc, which the operator owns.
REPLICASETS = [_replicaset("rs-svc", "deploy-svc"), _replicaset("rs-forged", "deploy-someone-elses")]
DEPLOYMENTS = {("a", "svc"): "deploy-svc", ("b", "svc"): "deploy-svc-b"}


def test_targets_are_running_engine_pods_with_an_address():
    pods = [_pod("p1"), _pod("p2", ip="fd00::1"), _pod("pending", phase="Pending", ip=""), _pod("other-ns", ns="b")]
    targets = targets_of(pods, ["a"])
    assert list(targets) == [("a", "svc")]
    assert [t.url for t in targets[("a", "svc")]] == ["http://10.0.0.1:8000/metrics", "http://[fd00::1]:8000/metrics"]


@pytest.mark.parametrize("pod", [
    _pod("no-owner", owner=None), _pod("an-unlisted-replicaset", owner="rs-other"),
    _pod("a-replicaset-named-alike-of-another-deployment", owner="rs-forged"),
    _pod("labelled-for-another-inferenceservice", label="other"), _pod("in-another-namespace", ns="b"),
    _pod("not-a-replicaset", kind="StatefulSet"), _pod("not-the-controller", controller=False),
    _pod("host-network", host_network=True),
], ids=lambda p: p["metadata"]["name"])
def test_a_labelled_pod_its_deployment_did_not_make_is_no_engine_pod(pod):
    # Anyone with pod create in a watched namespace can label a pod, and choose its port and (hostNetwork) address;
    # with ReplicaSet create, name a ReplicaSet as the Deployment controller would.
    assert engine_pods([pod], REPLICASETS, DEPLOYMENTS) == []
    assert engine_pods([_pod("p")], REPLICASETS, DEPLOYMENTS) == [_pod("p")]
    # Before the reconciler has read the Deployment (or once it is someone else's), no pod is its engine pod.
    assert engine_pods([_pod("p")], REPLICASETS, {}) == []


def test_the_engines_port_is_the_operators_whatever_the_pod_says():
    assert [t.url for t in targets_of([_pod("p", port=9000)], [])[("a", "svc")]] == ["http://10.0.0.1:8000/metrics"]


def _apply_merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386, as the API server applies a merge patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _apply_merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def test_the_written_patch_removes_figures_that_became_unknown():
    busy = _block(ttft=0.9)
    idle = build_serving(sm.Figures(0, 0, 0.0, None, 0.0, None, None, None), {}, 60.0, "2026-12-03T10:01:00Z")
    stored = _apply_merge_patch({"serving": busy}, {"serving": as_merge_patch(idle)})["serving"]
    assert stored == idle  # no stale p95 left behind, and the per-pod list replaced


def test_operator_refuses_bad_serving_flags():
    from flotilla.operator.main import parse_args

    args = parse_args(["--serving-period", "3", "--serving-window", "30"])
    assert (args.reading.period_s, args.reading.window_s) == (3.0, 30.0)
    assert parse_args(["--serving-period", "0"]).serving_period == 0  # off
    for bad in (["--serving-window", "0"], ["--serving-concurrency", "0"], ["--serving-period", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_parse_refuses_values_no_figure_can_be_made_of(value):
    with pytest.raises(sm.MetricsFormatError, match="NaN or infinite"):
        sm.parse(f"vllm:num_requests_running 1\nvllm:num_requests_waiting {value}\n", 0.0)


def test_figures_that_overflow_cost_only_their_own_inferenceservice():
    from flotilla.operator.serving_reader import ServingReader, Target

    reader = ServingReader(kube=None, namespaces=[], clock=lambda: 0.0)  # type: ignore[arg-type]
    base = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total {}\n"
    hostile, fine = Target("a", "hostile-0", "u"), Target("a", "fine-0", "u")
    targets = {("a", "hostile"): [hostile], ("a", "fine"): [fine]}
    # Each value is finite, but the counter's increase over the window is not: its rate overflows.
    reader.blocks(targets, {hostile: sm.parse(base.format("-1.7e308"), 0.0), fine: sm.parse(base.format(0), 0.0)})
    blocks = reader.blocks(targets, {hostile: sm.parse(base.format("1.7e308"), 10.0),
                                     fine: sm.parse(base.format(100), 10.0)})
    assert blocks[("a", "fine")]["generationTokensPerSecond"] == 10.0
    assert (blocks[("a", "hostile")]["scraped"], blocks[("a", "hostile")]["unreachable"]) == (0, 1)

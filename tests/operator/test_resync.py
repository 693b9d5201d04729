"""The periodic resync (handlers.resync_once) on a real apiserver: a bounded number of reconciles at once, one slow
or failing InferenceService holding up no other, no more reconciles once the operator stops, and an apiserver
connection for every thread that may call at once."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flotilla.operator.handlers import resync_once
from flotilla.operator.reconciler import Reconciler

from .conftest import wait_for
from .test_operator_reconcile import child_path, fixed

OTHERS = [f"b-{i}" for i in range(6)]


class CountingReconciler(Reconciler):
    """The operator's reconciler, noting how many of its reconciles run at once and which it ran."""

    def __init__(self, *args: Any, fail: str | None = None, **kwargs: Any):
        super().__init__(*args, post_event=lambda *_: None, **kwargs)
        self.fail, self.in_flight, self.most, self.done = fail, 0, 0, set[str]()
        self.started: list[str] = []
        self.counting = threading.Lock()

    def reconcile(self, namespace: str, name: str) -> Any:
        with self.counting:
            self.started.append(name)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            if name == self.fail:
                raise RuntimeError(f"a fault in the reconcile of {name}")
            result = super().reconcile(namespace, name)
            self.done.add(name)
            return result
        finally:
            with self.counting:
                self.in_flight -= 1


def _apply(cluster: Any, namespace: str, names: list[str]) -> None:
    for name in names:
        cluster.apply(fixed(name, namespace, replicas=1))


def test_a_slow_reconcile_holds_up_no_other(cluster, namespace):
    """a-slow comes first in the listing (by name) and its reconcile cannot finish: it waits for the InferenceService's
    lock, held here as a long reconcile of it in one of kopf's handler threads holds it. Every other one is reconciled
    meanwhile (one after another, all waited behind it), and the resync ends once a-slow's turn ends."""
    _apply(cluster, namespace, ["a-slow", *OTHERS])
    reconciler = CountingReconciler(cluster.kube)
    held = reconciler._lock(namespace, "a-slow")
    held.acquire()
    resync = threading.Thread(target=resync_once, args=(reconciler, [namespace], 2), daemon=True)
    try:
        resync.start()
        wait_for(lambda: reconciler.done >= set(OTHERS), 60, "the others reconciled while a-slow is held up")
        assert "a-slow" not in reconciler.done and resync.is_alive()
        for name in OTHERS:
            assert cluster.kube.get(child_path("Deployment", namespace, name)) is not None
    finally:
        held.release()
    resync.join(60)
    assert not resync.is_alive() and reconciler.done == {"a-slow", *OTHERS}
    assert cluster.kube.get(child_path("Deployment", namespace, "a-slow")) is not None


def test_no_more_reconciles_at_once_than_the_concurrency(cluster, namespace):
    _apply(cluster, namespace, OTHERS)
    for concurrency in (1, 3):
        reconciler = CountingReconciler(cluster.kube)
        resync_once(reconciler, [namespace], concurrency)
        assert reconciler.done == set(OTHERS)
        assert 1 <= reconciler.most <= concurrency


def test_a_fault_in_one_reconcile_stops_no_other(cluster, namespace, caplog):
    _apply(cluster, namespace, ["a-broken", *OTHERS])
    reconciler = CountingReconciler(cluster.kube, fail="a-broken")
    resync_once(reconciler, [namespace], 2)
    assert reconciler.done == set(OTHERS)
    assert f"resync of {namespace}/a-broken failed" in caplog.text


def test_a_stopped_resync_starts_no_more_reconciles(cluster, namespace, caplog):
    """The operator stopping (`stop` set) mid-round: each worker finishes the reconcile it has in flight and takes no
    other, so the round ends early, with the rest left for the next operator."""
    names = [f"s-{i:02d}" for i in range(16)]
    _apply(cluster, namespace, names)
    caplog.set_level("INFO", logger="flotilla.operator.handlers")
    reconciler, stop = CountingReconciler(cluster.kube), threading.Event()
    resync = threading.Thread(target=resync_once, args=(reconciler, [namespace], 2, stop), daemon=True)
    resync.start()
    wait_for(lambda: len(reconciler.done) >= 2, 60, "two reconciles of the resync")
    with reconciler.counting:
        stop.set()
        started_before = len(reconciler.started)
    resync.join(60)
    assert not resync.is_alive()
    # A worker that found `stop` unset just before it was set may start one more; no worker starts a second.
    assert len(reconciler.started) - started_before <= 2, reconciler.started
    assert len(reconciler.done) < len(names)
    assert f"{len(names) - len(reconciler.started)} of {len(names)} InferenceServices left" in caplog.text


@pytest.mark.filterwarnings("ignore:the kubeconfig disables TLS verification")
def test_no_connection_pool_warning_at_a_resync_concurrency_of_16(cluster, namespace, control_plane, monkeypatch,
                                                                   caplog):
    """The operator's client (Kube.from_environment, sized by main.apiserver_connections) keeps a connection for each
    of 16 resync workers. The kubernetes client's own pool, 5 per CPU, is 10 on CI's 2 CPUs (pinned here, so this
    holds on any machine): urllib3 then discarded the connections beyond it, "Connection pool is full" each time."""
    import multiprocessing

    import urllib3

    from flotilla.operator.kube import Kube
    from flotilla.operator.main import apiserver_connections, parse_args

    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 2)
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    concurrency = parse_args(["--resync-concurrency", "16"]).resync_concurrency
    kube = Kube.from_environment(pool_size=apiserver_connections(concurrency))
    names = [f"p-{i:02d}" for i in range(2 * concurrency)]
    _apply(cluster, namespace, names)
    caplog.set_level("WARNING", logger="urllib3.connectionpool")
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    reconciler = CountingReconciler(kube)
    for _ in range(2):  # making the children, then the converged round
        resync_once(reconciler, [namespace], concurrency)
    # More reconciles at once than the client's default pool here: the case that warned.
    assert reconciler.done == set(names) and 10 < reconciler.most <= concurrency
    assert "Connection pool is full" not in caplog.text


def test_the_operator_takes_a_resync_concurrency_of_one_or_more(capsys):
    from flotilla.operator.handlers import RESYNC_CONCURRENCY
    from flotilla.operator.main import parse_args

    assert parse_args([]).resync_concurrency == RESYNC_CONCURRENCY == 8
    assert parse_args(["--resync-concurrency", "1"]).resync_concurrency == 1
    for bad in ("0", "-3", "2.5"):
        with pytest.raises(SystemExit):
            parse_args(["--resync-concurrency", bad])
    assert "--resync-concurrency" in capsys.readouterr().err


def test_a_resync_with_nothing_to_reconcile_logs_nothing(cluster, namespace, caplog):
    """An operator watching namespaces with no InferenceService says nothing each period (review32 saw "resync:
    reconciling 0 InferenceServices, 0 at a time" at INFO every minute)."""
    caplog.set_level("INFO", logger="flotilla.operator.handlers")
    resync_once(CountingReconciler(cluster.kube), [namespace], 2)
    assert "resync" not in caplog.text, caplog.text
    _apply(cluster, namespace, ["one"])
    resync_once(reconciler := CountingReconciler(cluster.kube), [namespace], 2)
    assert reconciler.done == {"one"} and "resync: reconciling 1 InferenceServices, 1 at a time" in caplog.text

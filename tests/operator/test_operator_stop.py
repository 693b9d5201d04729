"""How long the operator takes to stop on SIGTERM, as Kubernetes stops its pod."""

from __future__ import annotations

import re
import time
from pathlib import Path

from flotilla.operator.handlers import resync_once
from flotilla.operator.reconciler import Reconciler

from ..slow_relay import through_relay
from .conftest import OperatorProcess, wait_for
from .test_operator_reconcile import fixed

# kopf, stopping for a signal, gives its leftover tasks 5 s before cancelling them; its own stop-flag waiter was one
# (main.register_stop_flag_raiser), so every stop took over 5 s. A stop is a fraction of a second now: this bound is
# loose for a loaded machine and still below the 5 s wait.
STOP_BOUND_S = 4.0


def test_sigterm_stops_the_operator_without_kopfs_leftover_wait(operator_process: OperatorProcess) -> None:
    """SIGTERM: the operator withdraws its webhooks and exits within STOP_BOUND_S, with exit code 0."""
    proc = operator_process.proc
    assert proc is not None and proc.poll() is None
    started = time.monotonic()
    operator_process.stop()
    took = time.monotonic() - started
    log = operator_process.log_path.read_text(errors="replace")
    assert proc.returncode == 0, operator_process.tail()
    assert "Signal SIGTERM is received" in log and "Cleaning up the admission webhook" in log
    assert took < STOP_BOUND_S, f"the operator took {took:.1f} s to stop:\n{operator_process.tail()}"


# InferenceServices, resync workers and relay delay for a resync round far longer than kopf's exit timeout (main.py:
# 15 s, then SIGKILL): each reconcile sends about 14 requests, each held 0.1 s by the relay.
SLOW_SERVICES, SLOW_CONCURRENCY, RELAY_DELAY_S = 30, 2, 0.1
# Stopping waits for the resync's two reconciles in flight, a few seconds behind the relay on a loaded machine; the
# whole round would take 30 x 1.4 s / 2 = 21 s.
RESYNC_STOP_BOUND_S = 12.0


def test_sigterm_cuts_a_running_resync_short(control_plane, cluster, namespace, tmp_path: Path,
                                             _session_operator: OperatorProcess) -> None:
    """SIGTERM during a resync of many InferenceServices behind a slow apiserver: the resync takes no other
    InferenceService after the reconciles in flight, so the operator exits (0) within RESYNC_STOP_BOUND_S, with the
    rest of the round left to its successor. Before, the stop waited for the whole round, and kopf killed it at 15 s.

    The session's operator is stopped meanwhile (the next test's `operator_process` starts it again): its writes to
    these InferenceServices' children would queue child events in this one, whose reconciles kopf lets finish too."""
    _session_operator.stop()
    for i in range(SLOW_SERVICES):
        cluster.apply(fixed(f"r-{i:02d}", namespace, replicas=1))
    # Converged before the operator starts, as in a cluster it has run in: a fresh child's updates (the deployment
    # controller's status) would each bring it a child event to reconcile.
    resync_once(Reconciler(cluster.kube), [namespace])
    _relay, kubeconfig = through_relay(control_plane.kubeconfig, RELAY_DELAY_S, tmp_path / "relay-kubeconfig")
    operator = OperatorProcess(control_plane, cluster, tmp_path)
    operator.start(webhook=False, kubeconfig=kubeconfig,
                   extra_args=("-n", namespace, "--resync-seconds", "1", "--resync-concurrency",
                               str(SLOW_CONCURRENCY), "--serving-period", "0"))
    try:
        # kopf's own reconciles at start-up (resume) run to the end once begun, even when it stops (it shields them):
        # let them finish, as in an operator that has been running a while, then stop as the next round begins.
        def log_count(line: str) -> int:
            return operator.log_path.read_text(errors="replace").count(line)

        wait_for(lambda: log_count("Handler 'reconcile' succeeded") >= SLOW_SERVICES, 120, "kopf's resumes")
        started = f"resync: reconciling {SLOW_SERVICES} InferenceServices, {SLOW_CONCURRENCY} at a time"
        rounds = log_count(started)
        wait_for(lambda: log_count(started) > rounds, 120, "a resync to start")
        proc = operator.proc
        assert proc is not None
        begun = time.monotonic()
        proc.terminate()
        proc.wait(60)
        took = time.monotonic() - begun
    finally:
        operator.stop()
    log = operator.log_path.read_text(errors="replace")
    assert proc.returncode == 0, operator.tail()
    left = re.search(rf"resync stopped, the operator is stopping: (\d+) of {SLOW_SERVICES} InferenceServices left", log)
    assert left is not None and int(left.group(1)) > 0, operator.tail()
    assert took < RESYNC_STOP_BOUND_S, f"the operator took {took:.1f} s to stop:\n{operator.tail()}"

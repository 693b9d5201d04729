"""The operator's supervision of kopf: transient failures start it again, lasting ones end it."""

from __future__ import annotations

import pytest

from flotilla.operator import main


def test_a_run_that_fails_then_stops_normally_returns():
    outcomes = [RuntimeError("404 page not found"), RuntimeError("again"), None]

    def run() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    main.run_resiliently(run, backoff_s=0)
    assert outcomes == []


def test_quick_failures_in_a_row_end_it_with_the_last_error():
    calls = []

    def run() -> None:
        calls.append(1)
        raise RuntimeError(f"failure {len(calls)}")

    with pytest.raises(RuntimeError, match="failure 3"):
        main.run_resiliently(run, quick_failures=3, backoff_s=0)
    assert len(calls) == 3


def test_a_healthy_run_resets_the_count(monkeypatch):
    monkeypatch.setattr(main, "HEALTHY_RUN_S", -1.0)  # every run counts as long-lived
    calls = []

    def run() -> None:
        calls.append(1)
        if len(calls) < 6:
            raise RuntimeError("transient")

    main.run_resiliently(run, quick_failures=2, backoff_s=0)
    assert len(calls) == 6


def test_resync_lists_watched_namespaces_one_by_one_unless_a_glob_needs_the_whole_cluster():
    from flotilla.operator.handlers import _resync_paths

    base = "/apis/serving.flotilla.dev/v1alpha1"
    assert _resync_paths([]) == [f"{base}/inferenceservices"]
    assert _resync_paths(["a", "b"]) == [f"{base}/namespaces/a/inferenceservices",
                                         f"{base}/namespaces/b/inferenceservices"]
    assert _resync_paths(["a", "team-*"]) == [f"{base}/inferenceservices"]

"""The delay before kopf retries a reconcile that met a Kubernetes API error (handlers.backoff)."""

from __future__ import annotations

from flotilla.operator.handlers import MAX_BACKOFF_S, backoff


def test_the_delay_doubles_up_to_a_minute_however_long_the_errors_last():
    assert [backoff(r) for r in range(8)] == [1, 2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S]
    # kopf's retry count keeps growing through a long outage (one a minute): 2.0 ** 1024 raised OverflowError
    assert backoff(1024) == backoff(10 ** 6) == MAX_BACKOFF_S

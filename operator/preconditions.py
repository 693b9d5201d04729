"""Writes made only on an object as it was read (its resourceVersion a precondition), tried once more on a fresh read.

A 409 of such a write says the object changed since it was read, and often only someone else's status write did
it: the kube-controller-manager's on a busy Deployment (an orphan being adopted), the serving reader's
status.serving on an InferenceService (the autoscaler's count copied into spec.replicas). Starting the whole
reconcile over meets the next such write as often, and after a few tries the reconcile waits kopf's backoff; one
more try on a fresh read, where the caller finds the object still fit for the write, mostly lands at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flotilla.operator.kube import KubeError

T = TypeVar("T")


def unless_conflict(write: Callable[[], T]) -> T | None:
    """`write()`'s answer, or None when the apiserver answered 409 (the precondition failed)."""
    try:
        return write()
    except KubeError as e:
        if e.status != 409:
            raise
        return None


def on_fresh_read(attempt: Callable[[dict[str, Any]], T | None], read: dict[str, Any],
                  reread: Callable[[], dict[str, Any] | None]) -> T | None:
    """`attempt(read)`, a write on the object as `read` that answers None when its precondition failed; then once
    more on `reread()` (not when the object is gone). The last attempt's answer, or None."""
    answer = attempt(read)
    if answer is not None:
        return answer
    fresh = reread()
    return attempt(fresh) if fresh is not None else None

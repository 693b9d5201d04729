"""The kopf handlers: every trigger runs the same reconcile (reconciler.py).

- create / update / resume of an InferenceService: reconcile; API errors are retried by kopf with
  backoff (TemporaryError); a refused spec is reported in status and then fails the handler for
  good (PermanentError), so kopf does not retry it until the spec changes. A child that belongs to
  someone else or that the apiserver refuses (ChildrenBlocked: nothing applied, status and an Event
  say why) is retried with backoff too, since the obstacle may go away.
- a change to any child (labelled managed-by flotilla-operator): reconcile its owner, so a
  hand-edited or hand-deleted child is put back within seconds. Echoes of the operator's own writes
  are skipped.
- delete: nothing to do but forget; the owner references let the garbage collector remove the
  children, and no finalizer is used, so deleting never waits for the operator.
- a periodic resync (started at operator start-up, not a kopf timer: timers would add a finalizer), a
  bounded number of InferenceServices at a time, catches what no event announces: events lost while
  the apiserver was away, a ServiceMonitor or KEDA CRD installed later (optional_kinds.py also
  reconciles once when kopf starts watching one). It stops between InferenceServices when the operator
  stops, so a rolling update of the operator waits for the reconciles in flight, not for the round.
"""

from __future__ import annotations

import asyncio
import contextvars
import fnmatch
import logging
import queue
import threading
from typing import Any

import kopf

from flotilla.operator.kube import KubeError
from flotilla.operator.message_limit import clip
from flotilla.operator.names import MANAGED_BY, MANAGED_BY_LABEL
from flotilla.operator.reconciler import ChildrenBlocked, Reconciler
from flotilla.operator.spec import GROUP, KIND, PLURAL, VERSION

CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
# Children watched for drift, as kopf resource selectors.
CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("autoscaling", None, "horizontalpodautoscalers"),
    ("policy", None, "poddisruptionbudgets"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    ("keda.sh", "v1alpha1", "scaledobjects"),
)
MAX_BACKOFF_S = 60.0
# InferenceServices the periodic resync reconciles at once (--resync-concurrency).
RESYNC_CONCURRENCY = 8

log = logging.getLogger(__name__)


def backoff(retry: int) -> float:
    """Seconds before retry number `retry`: 1, 2, 4, ... up to a minute."""
    # kopf counts retries without end (1,024 of them: 17 hours of API errors) and 2.0 ** 1024 overflows a float.
    return min(2.0 ** min(retry, 16), MAX_BACKOFF_S)


def owner_name(child: Any) -> str | None:
    """The name of the InferenceService that controls a child, if one does."""
    for ref in child.get("metadata", {}).get("ownerReferences", []):
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/") and ref.get("controller"):
            return ref.get("name")
    return None


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, namespaces: list[str],
             resync_seconds: float, resync_concurrency: int = RESYNC_CONCURRENCY) -> threading.Event:
    """Add the lifecycle, child-watch and resync handlers to `registry`; return the event that is set while kopf
    stops (cleared when it starts), for other callers of `resync_once` (optional_kinds.py) to stop with it."""

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    def reconcile(name: str, namespace: str | None, retry: int, **_: Any) -> None:
        """Converge the InferenceService and its children on its spec."""
        if namespace is None:
            raise kopf.PermanentError("an InferenceService is namespaced; this one has no namespace")
        try:
            result = reconciler.reconcile(namespace, name)
        except KubeError as e:
            # kopf keeps the message in an annotation (256 KiB with all the others); an API error may quote the object.
            raise kopf.TemporaryError(clip(f"Kubernetes API error, retrying: {e}"), delay=backoff(retry)) from e
        except ChildrenBlocked as e:
            raise kopf.TemporaryError(f"{e.reason}, retrying: {e.message}", delay=backoff(retry)) from e
        if result is not None and result.errors:
            raise kopf.PermanentError(f"spec refused (see status.conditions Valid): {result.message}")

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="forget", optional=True, registry=registry)
    def forget(name: str, namespace: str | None, **_: Any) -> None:
        """Drop in-memory state; the garbage collector deletes the children."""
        if namespace is not None:
            reconciler.forget(namespace, name)

    def child_changed(type: str | None, body: kopf.Body, namespace: str | None,
                      logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
        """Put a drifted or deleted child back by reconciling its owner."""
        owner = owner_name(body)
        if owner is None or type is None or namespace is None:
            return  # not ours, or the initial listing (resume and the resync cover it)
        if type != "DELETED" and reconciler.is_own_write(dict(body)):
            return  # the echo of our own apply
        try:
            reconciler.reconcile(namespace, owner)
        except (KubeError, ChildrenBlocked) as e:
            # Event handlers are not retried by kopf; the next event or the resync tries again.
            logger.warning(f"reconcile of {namespace}/{owner} after a {body.get('kind')} change failed: {e}")

    for group, version, plural in CHILD_RESOURCES:
        selector = (group, version, plural) if version else (f"{plural}.{group}",)
        kopf.on.event(*selector, id=f"child-{plural}", labels=CHILD_LABELS, registry=registry)(child_changed)

    tasks: list[asyncio.Task[None]] = []
    stopping = threading.Event()

    @kopf.on.startup(id="start-resync", registry=registry)
    async def start_resync(**_: Any) -> None:
        """Start the periodic resync loop."""
        stopping.clear()  # kopf may run again in the same process (main.run_resiliently, a new certificate)
        if resync_seconds > 0:
            tasks.append(asyncio.create_task(_resync_forever(reconciler, namespaces, resync_seconds,
                                                             resync_concurrency, stopping)))

    @kopf.on.cleanup(id="stop-resync", registry=registry)
    async def stop_resync(**_: Any) -> None:
        """Stop the resync loop, and any resync running in a thread after the reconciles it has in flight."""
        stopping.set()
        for task in tasks:
            task.cancel()
        tasks.clear()

    return stopping


def _resync_paths(namespaces: list[str]) -> list[str]:
    # A glob matches namespaces only a cluster-wide list can find; plain names are listed one by one,
    # which a Role in each namespace allows.
    if not namespaces or any(set(ns) & set("*?[") for ns in namespaces):
        return [f"/apis/{GROUP}/{VERSION}/{PLURAL}"]
    return [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in namespaces]


def resync_once(reconciler: Reconciler, namespaces: list[str], concurrency: int = RESYNC_CONCURRENCY,
                stop: threading.Event | None = None) -> None:
    """Reconcile every InferenceService in `namespaces` (all when empty) once, `concurrency` at a time; one's failure
    stops no other, and a slow one holds up only its own worker. Once `stop` is set no worker starts another: the
    resync ends when the reconciles in flight do.

    One after another, the resync of hundreds of InferenceServices took longer than its period against a distant
    apiserver (bench/operator_resync.py), and one slow reconcile delayed every one listed after it. A fixed number of
    threads (the client is synchronous) take the next InferenceService from the listing when they are done: at most
    `concurrency` reconciles and as many connections at once, however many InferenceServices there are.
    """
    keys: list[tuple[str, str]] = []
    for path in _resync_paths(namespaces):
        for item in reconciler.kube.list(path):
            meta = item["metadata"]
            if not namespaces or any(fnmatch.fnmatchcase(meta["namespace"], ns) for ns in namespaces):
                keys.append((meta["namespace"], meta["name"]))
    pending = queue.SimpleQueue[tuple[str, str]]()
    for key in keys:
        pending.put(key)
    if stop is None:
        stop = threading.Event()
    workers_n = min(max(concurrency, 1), len(keys))
    if not keys:  # an operator with nothing to serve says nothing every period
        return
    log.info(f"resync: reconciling {len(keys)} InferenceServices, {workers_n} at a time")

    def work() -> None:
        # Asked before each one: the operator's stop (a rolling update of hundreds of InferenceServices) would
        # otherwise wait for the whole round, and past kopf's exit timeout be killed.
        while not stop.is_set():
            try:
                namespace, name = pending.get_nowait()
            except queue.Empty:
                return
            _resync_one(reconciler, namespace, name)

    # Each worker in its own copy of the caller's context (kopf's, for its Events): a context runs in one thread.
    workers = [threading.Thread(target=contextvars.copy_context().run, args=(work,), name=f"resync-{i}", daemon=True)
               for i in range(workers_n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if stop.is_set() and not pending.empty():
        log.info(f"resync stopped, the operator is stopping: {pending.qsize()} of {len(keys)} InferenceServices "
                 "left for the next operator")


def _resync_one(reconciler: Reconciler, namespace: str, name: str) -> None:
    try:
        reconciler.reconcile(namespace, name)
    except (KubeError, ChildrenBlocked) as e:
        log.warning(f"resync of {namespace}/{name} failed: {e}")
    except Exception:
        # A fault in one InferenceService's reconcile must not cost the others their resync.
        log.exception(f"resync of {namespace}/{name} failed")


async def _resync_forever(reconciler: Reconciler, namespaces: list[str], interval: float, concurrency: int,
                          stop: threading.Event) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        try:
            # In a thread (the client is synchronous), with kopf's context so events can be posted. Cancelling this
            # task leaves the thread running (asyncio.run waits for it at exit): `stop` is what ends it early.
            await loop.run_in_executor(None, contextvars.copy_context().run, resync_once, reconciler, namespaces,
                                       concurrency, stop)
        except asyncio.CancelledError:
            stop.set()
            raise
        except KubeError as e:
            log.warning(f"resync failed, next in {interval:g} s: {e}")
        except Exception:
            log.exception("resync failed")

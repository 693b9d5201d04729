"""kopf keeps watching the optional children's kinds (ServiceMonitor, ScaledObject) whose CRDs come or go later.

kopf starts (or stops) watching a kind when an event of a CRD finds the kind in (or gone from) the apiserver's
discovery. Discovery can lag the CRD's events: on the tests' 1.20 apiserver the CRD's ADDED and both
Established updates arrived before `/apis/monitoring.coreos.com/v1` listed servicemonitors, and kopf without the
right to watch CRDs never looks again. An operator started before the Prometheus Operator or KEDA then did not
watch ServiceMonitors or ScaledObjects until it was restarted, and a hand edit of one was undone only by the next
resync. So every CHECK_S the operator compares what discovery serves with what kopf watches and, where they
differ, hands kopf the rescan it makes for a CRD event (no restart: the webhook keeps answering), then
reconciles every InferenceService once when a kind was added (its children can be made at once, and an edit made
while the kind was unwatched is undone).

The same kinds can go away under a running operator (the Prometheus Operator or KEDA uninstalled): the apiserver
then closes the kind's watch, and kopf's reconnect gets a 404 unless a CRD event made kopf drop the kind first
(kopf without `watch` on CRDs never does; with it, under load, the reconnect can win). kopf treats any error of a
watch as fatal: the whole operator stopped, webhooks and Events of reconciles in flight with it. So the watch of
an optional kind is wrapped: its 404 ends no operator, the watch tries again every CHECK_S (it resumes when the
CRD returns), and the check runs at once, so kopf's rescan drops the kind until discovery serves it again.

Three kopf internals are used: the Insights object that `kopf.run(insights=...)` fills,
`observation.process_discovered_resource_event`, the function kopf calls for a CRD event, and `queueing.watcher`,
the task kopf runs per watched kind (wrapped, as its module attribute, which kopf's orchestrator looks up for each
new watch). When a kopf release moves them the operator says so at start-up: a CRD installed later is then picked
up by the resync or a restart, and one removed stops kopf, which `main.run_resiliently` starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

import kopf

from flotilla.operator.kube import Kube, KubeError


def _kopf_internals() -> tuple[Any, Any, Any, type[Exception]] | None:
    """(Insights, process_discovered_resource_event, the queueing module, APINotFoundError), or None where this kopf
    release moved them."""
    try:
        from kopf._cogs.clients.errors import APINotFoundError
        from kopf._cogs.structs.references import Insights
        from kopf._core.reactor import queueing
        from kopf._core.reactor.observation import process_discovered_resource_event
    except ImportError:  # pragma: no cover - depends on the kopf release
        return None
    if not callable(getattr(queueing, "watcher", None)):  # pragma: no cover - depends on the kopf release
        return None
    return Insights, process_discovered_resource_event, queueing, APINotFoundError


INTERNALS = _kopf_internals()

Kind = tuple[str, str, str]  # (group, version, plural)
# The children whose CRDs a cluster may lack.
OPTIONAL_KINDS: tuple[Kind, ...] = (("monitoring.coreos.com", "v1", "servicemonitors"),
                                    ("keda.sh", "v1alpha1", "scaledobjects"))
# How often discovery is compared with what kopf watches: two GETs of discovery documents.
CHECK_S = 5.0
# Rescans for one state of discovery before giving up on it (kopf may leave a kind out on purpose, e.g. one
# that cannot be watched; apiservers behind a load balancer may briefly disagree).
ATTEMPTS = 3

log = logging.getLogger(__name__)


def available() -> bool:
    """Whether this kopf release has the internals the rescan uses."""
    return INTERNALS is not None


def served(kube: Kube) -> frozenset[Kind]:
    """The optional kinds discovery serves now, read as kopf's own scan reads them (group list, then the
    group/version's resource list, which is the one that lags)."""
    listed = {v["groupVersion"] for g in kube.request("GET", "/apis").get("groups", []) for v in g.get("versions", [])}
    kinds = set()
    for group, version, plural in OPTIONAL_KINDS:
        if f"{group}/{version}" in listed:
            resources = kube.get(f"/apis/{group}/{version}") or {}
            if any(r.get("name") == plural for r in resources.get("resources", [])):
                kinds.add((group, version, plural))
    return frozenset(kinds)


def watched(insights: Any) -> frozenset[Kind]:
    """The optional kinds kopf watches now (from its Insights)."""
    return frozenset((r.group, r.version, r.plural) for r in insights.watched_resources) & frozenset(OPTIONAL_KINDS)


def describe(kinds: frozenset[Kind]) -> str:
    return ", ".join(f"{plural} ({group}/{version})" for group, version, plural in sorted(kinds))


class OptionalKinds:
    """The Insights of the current kopf run, and the task that keeps kopf's watches in step with discovery."""

    def __init__(self, kube: Kube, on_added: Callable[[], None], interval: float = CHECK_S):
        self.kube, self.on_added, self.interval = kube, on_added, interval
        self.current: Any = None
        # The kinds whose watch got a 404 (their CRD was removed) since discovery last served them.
        self.gone: set[Kind] = set()
        # Set by such a watch: compare discovery with kopf's watches now (the event loop's own, made at start-up).
        self.wake: asyncio.Event | None = None

    def fresh_insights(self) -> Any:
        """A new Insights for the next `kopf.run` (its asyncio primitives belong to one event loop), or None."""
        self.current = INTERNALS[0]() if INTERNALS is not None else None
        self.gone.clear()  # the new run's kopf scans discovery afresh
        return self.current

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Start the check with the operator and stop it at clean-up."""
        if not available():
            log.warning("this kopf release lacks the internals the operator uses to watch a ServiceMonitor or KEDA "
                        "CRD installed after start-up: such a CRD is picked up by the resync or a restart")
            return
        self.guard_watches()
        tasks: list[asyncio.Task[None]] = []

        @kopf.on.startup(id="watch-optional-kinds", registry=registry)
        async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
            """Start comparing discovery with kopf's watches (in kopf's context: its requests need it)."""
            self.wake = asyncio.Event()
            if self.current is not None and self.interval > 0:
                tasks.append(asyncio.create_task(self.keep_in_step(self.current, settings, registry)))

        @kopf.on.cleanup(id="stop-optional-kinds", registry=registry)
        async def stop(**_: Any) -> None:
            """Stop the comparison."""
            for task in tasks:
                task.cancel()

    def guard_watches(self) -> None:
        """Wrap kopf's watch task: a 404 of an optional kind's watch (its CRD was removed) is not fatal to kopf; the
        watch tries again every `interval` and wakes the check."""
        assert INTERNALS is not None  # register() calls this only with them
        queueing, not_found = INTERNALS[2], INTERNALS[3]
        original = getattr(queueing.watcher, "__wrapped__", queueing.watcher)  # one wrapper, however often called

        @functools.wraps(original)
        async def watcher(*, resource: Any, **kwargs: Any) -> None:
            kind = (resource.group, resource.version, resource.plural)
            while True:
                try:
                    return await original(resource=resource, **kwargs)
                except not_found:
                    if kind not in OPTIONAL_KINDS:
                        raise  # our own CRD or a built-in kind: kopf stops, main.run_resiliently starts it again
                    if kind not in self.gone:
                        log.info(f"the apiserver no longer serves {describe(frozenset({kind}))} (its CRD was "
                                 f"removed): kopf's watch of it tries again every {self.interval:g} s")
                    self.gone.add(kind)
                    if self.wake is not None:
                        self.wake.set()
                await asyncio.sleep(self.interval if self.interval > 0 else CHECK_S)  # 0: no check, still no spin

        queueing.watcher = watcher

    async def keep_in_step(self, insights: Any, settings: kopf.OperatorSettings,
                           registry: kopf.OperatorRegistry) -> None:
        """Every `interval`: where discovery and kopf's watches differ, rescan the kinds' groups as kopf does for
        a CRD event; reconcile everything once when kopf starts watching a kind (whoever's rescan did it)."""
        loop = asyncio.get_running_loop()
        await insights.ready_resources.wait()  # kopf's initial scan
        known = watched(insights) - self.gone
        tried: tuple[frozenset[Kind], int] = (frozenset(), 0)
        while True:
            await self._next_check()
            try:
                now = await loop.run_in_executor(None, served, self.kube)
            except KubeError as e:
                log.debug(f"discovery unavailable, next check in {self.interval:g} s: {e}")
                continue
            self.gone -= now  # served again: the watch's next try resumes it
            if now != watched(insights):
                attempts = tried[1] + 1 if tried[0] == now else 1
                tried = (now, attempts)
                if attempts <= ATTEMPTS:
                    missed = now ^ watched(insights)
                    log.info(f"kopf's watches differ from what the apiserver serves for {describe(missed)} (a CRD "
                             "event came before discovery changed, or kopf may not watch CRDs): rescanning")
                    assert INTERNALS is not None  # register() starts no check without them
                    try:
                        for group in sorted({kind[0] for kind in missed}):
                            await INTERNALS[1](raw_event={"type": "MODIFIED", "object": {"spec": {
                                "group": group}}}, settings=settings, registry=registry, insights=insights)
                    except TypeError:  # a kopf release that changed the function's arguments
                        log.exception("kopf's rescan cannot be called here; a CRD installed later is picked up by "
                                      "the resync or a restart")
                        return
                    except Exception as e:  # the apiserver failed kopf's discovery reads: the next check retries
                        log.warning(f"rescanning for {describe(missed)} failed, next check in {self.interval:g} s: {e}")
                        tried = (now, attempts - 1)  # not an attempt kopf could act on
                        continue
                    if attempts == ATTEMPTS and now != watched(insights):
                        log.warning(f"kopf still does not follow discovery for {describe(now ^ watched(insights))};"
                                    " hand edits of those children are undone by the resync")
            current = watched(insights) - self.gone
            if current - known:
                log.info(f"now watching {describe(current - known)}: reconciling every InferenceService")
                try:
                    await loop.run_in_executor(None, contextvars.copy_context().run, self.on_added)
                except Exception:
                    log.exception("the reconcile after a new kind failed; the resync tries again")
            if known - current:
                log.info(f"no longer watching {describe(known - current)}: the apiserver stopped serving them")
            known = current

    async def _next_check(self) -> None:
        """Sleep `interval`, or less when a watch got a 404."""
        assert self.wake is not None  # made at start-up, before this task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), self.interval)
        self.wake.clear()

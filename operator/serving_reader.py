"""The periodic reader of engine `/metrics` that writes each InferenceService's `status.serving`.

Every `period_s` it lists the engine pods (one call per watched namespace, or one cluster-wide, by
the InferenceService label; of those, only the pods the InferenceService's Deployment made: `targets_of`), fetches
every running pod's `/metrics` on the engine's port with at most `concurrency`
requests in flight and `timeout_s` each, keeps each pod's scrapes over the last `window_s`, and
writes the figures (serving_metrics.py) into status when they moved enough (serving_status.py).
A pod that does not answer is counted as unreachable, never waited for; a failing API server is
logged and tried again next period. It runs in kopf's event loop, started at operator start-up.

The same listing tells what problem an InferenceService's pods (again only those its Deployment made) have
(pod_problems.py: an image that does not pull, a crash loop, no node); where it is not the one its Ready
condition names (`shown_problems`: the reconciler's record of the conditions it wrote, so no listing of the
InferenceServices), `on_pod_problem` (the reconciler) is called for it, so Ready names the problem, or stops
naming a cleared one, within a period rather than at the next resync, without watching pods.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import fnmatch
import itertools
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf
from pydantic import BaseModel, Field

from flotilla.operator import names
from flotilla.operator import serving_metrics as sm
from flotilla.operator.engine_pods import engine_pods
from flotilla.operator.kube import Kube, KubeError
from flotilla.operator.pod_problems import pod_problem
from flotilla.operator.serving_status import Thresholds, as_merge_patch, build_serving, worth_writing
from flotilla.operator.spec import GROUP, VERSION

# Read no more of a /metrics body than this: an engine's is ~20 kB; a broken endpoint must not
# fill the operator's memory.
MAX_BODY_BYTES = 4 << 20
# Only these lines are parsed; the rest of the body (other histograms) is skipped cheaply.
_WANTED = (sm.RUNNING, sm.WAITING, sm.KV_USAGE, sm.PREFIX_QUERIES, sm.PREFIX_HITS, sm.GENERATION_TOKENS,
           f"{sm.TTFT}_bucket", f"{sm.ITL}_bucket")
_WANTED_LINE = re.compile("^(?:" + "|".join(map(re.escape, _WANTED)) + ")[^\r\n]*", re.MULTILINE)
# At most this many of those lines are parsed. An engine has about 50 a model name (a gauge or counter each, 23
# TTFT and 20 inter-token-latency buckets); the engine image is its author's, and 4 MiB of them (72 000 buckets) took
# the operator 2 s of CPU to parse, on the event loop that also answers the admission webhooks and handles every
# watch event, each period for each such pod. A body with more is no engine's: the pod counts as unreachable.
MAX_WANTED_LINES = 1024

log = logging.getLogger(__name__)


class ReaderSettings(BaseModel):
    """How often and how hard the operator reads the engines."""

    period_s: float = Field(default=10.0, gt=0, description="Seconds between reads.")
    window_s: float = Field(default=60.0, gt=0, description="Window of the rates and latency percentiles.")
    concurrency: int = Field(default=32, ge=1, description="Scrapes in flight at once.")
    timeout_s: float = Field(default=2.0, gt=0, description="Seconds one scrape may take.")
    thresholds: Thresholds = Field(default_factory=Thresholds)


@dataclass(frozen=True)
class Target:
    """One engine pod to scrape."""

    namespace: str
    pod: str
    url: str


def targets_of(pods: list[dict[str, Any]], namespaces: list[str]) -> dict[tuple[str, str], list[Target]]:
    """Running engine pods with an address, by (namespace, InferenceService) (a pure function; `pods` are those
    their Deployments made, engine_pods.py), on the port the operator gives the engine (names.HTTP_PORT), never one a
    pod's own spec names."""
    out: dict[tuple[str, str], list[Target]] = {}
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status", {})
        owner = meta.get("labels", {}).get(names.INFERENCESERVICE_LABEL)
        if not owner or meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        if namespaces and not any(fnmatch.fnmatchcase(meta["namespace"], ns) for ns in namespaces):
            continue
        ip = status.get("podIP")
        if not ip:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out.setdefault((meta["namespace"], owner), []).append(
            Target(meta["namespace"], meta["name"], f"http://{host}:{names.HTTP_PORT}/metrics"))
    return out


def problem_reasons(pods: list[dict[str, Any]], namespaces: list[str]) -> dict[tuple[str, str], str]:
    """The pod problem's reason of each watched (namespace, InferenceService) that has one (a pure function; `pods`
    are those their Deployments made, engine_pods.py)."""
    by_owner: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        owner = pod["metadata"].get("labels", {}).get(names.INFERENCESERVICE_LABEL)
        watched = not namespaces or any(fnmatch.fnmatchcase(pod["metadata"]["namespace"], ns) for ns in namespaces)
        if owner and watched:
            by_owner.setdefault((pod["metadata"]["namespace"], owner), []).append(pod)
    found = {key: pod_problem(group) for key, group in by_owner.items()}
    return {key: problem.reason for key, problem in found.items() if problem is not None}


def wanted_lines(text: str) -> str:
    """The sample lines the figures need (comments and other series dropped before parsing, by one regular expression:
    a Python loop over 4 MiB of empty lines took 0.7 s of CPU); MetricsFormatError past MAX_WANTED_LINES of them."""
    lines = [m.group() for m in itertools.islice(_WANTED_LINE.finditer(text), MAX_WANTED_LINES + 1)]
    if len(lines) > MAX_WANTED_LINES:
        raise sm.MetricsFormatError(f"more than {MAX_WANTED_LINES} samples of the series the figures read: not one "
                                    "engine's /metrics")
    return "\n".join(lines) + "\n"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _finite(block: Any) -> Any:
    """`block`, once every number in it is known finite (JSON, and so the apiserver, has no NaN or Infinity)."""
    values = block.values() if isinstance(block, dict) else block if isinstance(block, list) else [block]
    for value in values:
        if isinstance(value, dict | list):
            _finite(value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"a figure is {value}")
    return block


@dataclass
class _Written:
    block: dict[str, Any]
    at: float


@dataclass
class ServingReader:
    """Reads the engines and writes status.serving; `read_once` is one period's work."""

    kube: Kube
    namespaces: list[str]
    settings: ReaderSettings = field(default_factory=ReaderSettings)
    now: Callable[[], str] = _now
    clock: Callable[[], float] = time.monotonic
    history: dict[tuple[str, str], deque[sm.Scrape]] = field(default_factory=dict)  # (namespace, pod)
    written: dict[tuple[str, str], _Written] = field(default_factory=dict)  # (namespace, InferenceService)
    writes: int = 0
    # Called with (namespace, InferenceService) when its pods' problem is not the one its Ready condition names
    # (synchronous, in a thread).
    on_pod_problem: Callable[[str, str], object] | None = None
    # The pod problem each InferenceService's Ready condition names, where it names one (the reconciler's record).
    shown_problems: Callable[[], dict[tuple[str, str], str]] = dict
    # Each InferenceService's own Deployment's uid, by (namespace, InferenceService) (the reconciler's record): only
    # the pods it made are read.
    deployments: Callable[[], dict[tuple[str, str], str]] = dict
    # (namespace, InferenceService) -> (the pods' problem, the one Ready names) of a disagreement already reconciled.
    disagreements: dict[tuple[str, str], tuple[str | None, str | None]] = field(default_factory=dict)

    def _paths(self, prefix: str, plural: str) -> list[str]:
        """One collection per watched namespace, or the cluster-wide one when a glob needs every namespace."""
        if not self.namespaces or any(set(ns) & set("*?[") for ns in self.namespaces):
            return [f"{prefix}/{plural}"]
        return [f"{prefix}/namespaces/{ns}/{plural}" for ns in self.namespaces]

    def list_pods(self) -> list[dict[str, Any]]:
        """The engine pods of every watched namespace: the labelled pods that each InferenceService's own Deployment
        made (engine_pods.py; one more listing, of ReplicaSets); synchronous: call it in a thread."""
        label = names.INFERENCESERVICE_LABEL
        pods = [pod for path in self._paths("/api/v1", "pods") for pod in self.kube.list(path, label)]
        replicasets = [rs for path in self._paths("/apis/apps/v1", "replicasets") for rs in self.kube.list(path, label)]
        return engine_pods(pods, replicasets, self.deployments())

    async def _scrape(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, target: Target,
                      ) -> sm.Scrape | None:
        async with gate:
            try:
                # Only the pod listed: an engine image is its author's, and a redirect it answers could point the
                # operator, which reaches every namespace's engines, at anything it can reach.
                async with session.get(target.url, allow_redirects=False) as response:
                    if response.status != 200:
                        return None
                    body = await response.content.read(MAX_BODY_BYTES)
                at = self.clock()
                return sm.parse(wanted_lines(body.decode("utf-8", "replace")), at)
            except (aiohttp.ClientError, TimeoutError, sm.MetricsFormatError, UnicodeError) as e:
                log.debug(f"scrape of {target.namespace}/{target.pod} ({target.url}) failed: {e}")
                return None

    def _remember(self, target: Target, scrape: sm.Scrape) -> list[sm.Scrape]:
        history = self.history.setdefault((target.namespace, target.pod), deque())
        history.append(scrape)
        # Keep one scrape older than the window, so a window always has a start once it is full.
        while len(history) > 2 and scrape.at - history[1].at > self.settings.window_s:
            history.popleft()
        return list(history)

    def blocks(self, targets: dict[tuple[str, str], list[Target]],
               scrapes: dict[Target, sm.Scrape | None]) -> dict[tuple[str, str], dict[str, Any]]:
        """Each InferenceService's status.serving from this period's scrapes (updates the history)."""
        out = {}
        for key, pods in targets.items():
            windows = {}
            for target in pods:
                scrape = scrapes.get(target)
                if scrape is not None:
                    windows[target.pod] = sm.window_of(self._remember(target, scrape), self.settings.window_s)
            try:
                per_pod = {pod: sm.figures([w]) for pod, w in windows.items()}
                out[key] = _finite(build_serving(sm.figures(list(windows.values())), per_pod, self.settings.window_s,
                                                 self.now(), unreachable=len(pods) - len(windows)))
            except (ArithmeticError, ValueError) as e:
                # Figures no status can hold (an engine's values overflow a rate or a sum): this InferenceService's
                # pods count as unreachable and its history starts over; every other one is still written.
                log.warning(f"status.serving of {key[0]}/{key[1]}: its engines' figures are unusable: {e}")
                for target in pods:
                    self.history.pop((target.namespace, target.pod), None)
                out[key] = build_serving(sm.figures([]), {}, self.settings.window_s, self.now(),
                                         unreachable=len(pods))
        live = {(t.namespace, t.pod) for pods in targets.values() for t in pods}
        for gone in self.history.keys() - live:
            del self.history[gone]
        return out

    def write(self, blocks: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Patch status.serving where it moved enough; remove it where the pods are gone (synchronous)."""
        now = self.clock()
        for (namespace, name), block in blocks.items():
            old = self.written.get((namespace, name))
            if not worth_writing(old.block if old else None, block, now - old.at if old else 0.0,
                                 self.settings.thresholds):
                continue
            if self._patch(namespace, name, block):
                self.written[(namespace, name)] = _Written(block, now)
        for namespace, name in list(self.written.keys() - blocks.keys()):
            self._patch(namespace, name, None)
            del self.written[(namespace, name)]

    def _patch(self, namespace: str, name: str, block: dict[str, Any] | None) -> bool:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/inferenceservices/{name}"
        try:
            self.kube.patch_status(path, {"serving": None if block is None else as_merge_patch(block)})
        except KubeError as e:
            if e.status != 404:  # pods whose InferenceService is gone (or not made by us): nothing to write
                log.warning(f"writing status.serving of {namespace}/{name} failed: {e}")
            return False
        self.writes += 1
        return True

    def announce_problems(self, pods: list[dict[str, Any]], shown: dict[tuple[str, str], str]) -> None:
        """Call `on_pod_problem` for each InferenceService whose pods' problem is not the one its Ready condition
        names, `shown` (synchronous). Compared with the status, not with the last listing: a problem that came and
        went between two listings, written meanwhile by a reconcile of another trigger, would stay named until the
        resync. Once per disagreement: the reconciler does not read the pods of a Deployment with every replica
        ready (a failing surge pod of a rollout), and that disagreement must not cost a reconcile every period."""
        seen = problem_reasons(pods, self.namespaces)
        shown = {key: reason for key, reason in shown.items()
                 if not self.namespaces or any(fnmatch.fnmatchcase(key[0], ns) for ns in self.namespaces)}
        disagreements = {key: (seen.get(key), shown.get(key)) for key in seen.keys() | shown.keys()
                         if seen.get(key) != shown.get(key)}
        new = {key for key, pair in disagreements.items() if self.disagreements.get(key) != pair}
        self.disagreements = disagreements
        for namespace, name in sorted(new):
            if self.on_pod_problem is None:
                continue
            try:
                self.on_pod_problem(namespace, name)
            except Exception as e:  # one InferenceService's failure must not stop the others' (nor the figures)
                log.warning(f"reconcile of {namespace}/{name} after its pods changed failed: {e}")

    async def read_once(self, session: aiohttp.ClientSession) -> dict[tuple[str, str], dict[str, Any]]:
        """One period: list, scrape, compute, write. Returns the blocks computed."""
        loop = asyncio.get_running_loop()
        run = contextvars.copy_context().run
        pods = await loop.run_in_executor(None, run, self.list_pods)
        if self.on_pod_problem is not None:
            await loop.run_in_executor(None, run, self.announce_problems, pods, self.shown_problems())
        targets = targets_of(pods, self.namespaces)
        gate = asyncio.Semaphore(self.settings.concurrency)
        flat = [t for pods_ in targets.values() for t in pods_]
        results = await asyncio.gather(*(self._scrape(session, gate, t) for t in flat))
        blocks = self.blocks(targets, dict(zip(flat, results, strict=True)))
        await loop.run_in_executor(None, run, self.write, blocks)
        return blocks

    async def run_forever(self) -> None:
        """Read every period until cancelled; errors are logged and the next period tries again."""
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.settings.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                started = self.clock()
                try:
                    await self.read_once(session)
                except KubeError as e:
                    log.warning(f"reading the engines' metrics failed, next in {self.settings.period_s:g} s: {e}")
                except Exception:
                    log.exception("reading the engines' metrics failed")
                await asyncio.sleep(max(0.0, self.settings.period_s - (self.clock() - started)))


def register(registry: kopf.OperatorRegistry, reader: ServingReader) -> None:
    """Start the reader with the operator and stop it on exit."""
    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(id="start-serving-reader", registry=registry)
    async def start(**_: Any) -> None:
        tasks.append(asyncio.create_task(reader.run_forever()))

    @kopf.on.cleanup(id="stop-serving-reader", registry=registry)
    async def stop(**_: Any) -> None:
        for task in tasks:
            task.cancel()

"""Why engine pods are not coming up, read from the pods themselves (a pure function).

The Deployment says nothing of a pod that cannot pull its image, lacks a Secret, crash-loops or
cannot be scheduled until its progress deadline (600 s by default) has passed. The kubelet and the
scheduler say it at once, in the pod's status: a container's waiting reason, its last termination,
the PodScheduled condition. `pod_problem` picks the first such problem, so the Ready condition can
name it (status_writer.py) while the pods are not ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Waiting reasons that mean the container will not start without a change (a fixed image name, a
# created Secret) or keeps failing. ErrImagePull and ImagePullBackOff alternate on every retry of the
# kubelet: both are reported as ImagePullBackOff, so a retry is not a new problem (nor a new Event).
_WAITING = {
    "ErrImagePull": "ImagePullBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImageNeverPull": "ErrImageNeverPull",
    "InvalidImageName": "InvalidImageName",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
    "RunContainerError": "RunContainerError",
    "CrashLoopBackOff": "CrashLoopBackOff",
}
# The reasons `pod_problem` can return; a Ready condition with one of them is bad news.
REASONS = frozenset({*_WAITING.values(), "Unschedulable"})
# Messages of the kubelet and the scheduler can be long (one line per node); a condition is read by people.
MAX_MESSAGE = 400
# execve's E2BIG as runc writes it to the container's log ("exec /opt/flotilla/bin/flotilla: argument list too long",
# the termination message under FallbackToLogsOnError) or a runtime into the waiting message. Admission checks the
# spec's own strings (exec_size.py); values from Secrets and ConfigMaps are known only here, in the pod.
E2BIG = "argument list too long"
E2BIG_CAUSE = ("Linux refused to start the engine: its arguments and environment, Secret and ConfigMap values "
               "included, pass execve's limits (128 KiB a string, 2 MiB in all); ")


@dataclass(frozen=True)
class PodProblem:
    """One pod's problem: a CamelCase reason and a message naming the pod (and container)."""

    reason: str
    message: str


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def _last_termination(status: dict[str, Any]) -> str:
    """The last termination's reason and exit code, and the last line of its message (the engine's log tail: the
    engine container's terminationMessagePolicy is FallbackToLogsOnError), e.g. a traceback's exception line."""
    last = (status.get("lastState") or {}).get("terminated") or {}
    if not last:
        return ""
    lines = [line for line in (last.get("message") or "").splitlines() if line.strip()]
    said = f": {lines[-1].strip()}" if lines else ""
    return f"; last terminated: {last.get('reason') or 'unknown reason'} (exit code {last.get('exitCode', '?')}){said}"


def _cause(*texts: str) -> str:
    # What the runtime's words mean for this pod, said first so that clipping keeps it.
    return E2BIG_CAUSE if any(E2BIG in text for text in texts) else ""


def _container_problem(pod: str, status: dict[str, Any]) -> PodProblem | None:
    where = f"pod {pod} container {status.get('name', '?')}"
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason = _WAITING.get(waiting.get("reason", ""))
    if reason is not None:
        said = str(waiting.get("message") or waiting["reason"])
        restarts = status.get("restartCount", 0)
        again = f"; restarted {restarts} times" if reason == "CrashLoopBackOff" and restarts else ""
        last = _last_termination(status)
        return PodProblem(reason, _clip(f"{where}: {_cause(said, last)}{said}{again}{last}"))
    if status.get("restartCount", 0) and not status.get("ready") and (last := _last_termination(status)):
        # Between two back-offs a crash-looping container runs (not ready) for a while: still the same crash loop,
        # so the reason does not flicker (and post an Event) on every restart.
        return PodProblem("CrashLoopBackOff", _clip(
            f"{where}: {_cause(last)}restarted {status['restartCount']} times{last}"))
    return None


def _unschedulable(pod: dict[str, Any]) -> PodProblem | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            name = pod["metadata"]["name"]
            return PodProblem("Unschedulable", _clip(f"pod {name}: {c.get('message') or 'no node fits'}"))
    return None


def pod_problem(pods: list[dict[str, Any]]) -> PodProblem | None:
    """The first problem of the (not deleted) pods, sorted by name: unschedulable, then init containers', then
    containers'; None when no pod has one (pods still pulling, loading or ready)."""
    live = sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])
    for pod in live:
        found = _unschedulable(pod)
        status = pod.get("status") or {}
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            found = found or _container_problem(pod["metadata"]["name"], container)
        if found is not None:
            return found
    return None

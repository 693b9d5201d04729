"""spec.lora.adapters -> pod volumes at /adapters/<name>, mounted like the model.

`pvc://` and `hostPath://` sources mount read-only; `hf://` downloads with an init container that runs
the engine image (as the model does, hf_download.py: with spec.pod.env's HF_TOKEN for a gated repository),
into a size-limited emptyDir of the pod. The engine reads them through `--lora-modules <name>=/adapters/<name>`
(engine_args.py).
"""

from __future__ import annotations

from typing import Any

from flotilla.operator.hf_download import download_container
from flotilla.operator.spec import InferenceServiceSpec, LoraAdapter, hf_revision, parse_source

ADAPTER_ROOT = "/adapters"
# An adapter is megabytes (rank 16 on all projections of an 8B model: ~170 MB in bf16).
DOWNLOAD_SIZE = "2Gi"


def adapter_path(name: str) -> str:
    """Where the engine container sees an adapter."""
    return f"{ADAPTER_ROOT}/{name}"


def lora_modules(spec: InferenceServiceSpec) -> list[str] | None:
    """The `--lora-modules` values, or None when no adapter is served from the start."""
    if spec.lora is None or not spec.lora.adapters:
        return None
    return [f"{a.name}={adapter_path(a.name)}" for a in spec.lora.adapters]


def pod_names(adapter: LoraAdapter) -> dict[str, str]:
    """What an adapter names in the pod: its volume and, for an hf:// source, its download init container; each cut
    to 63 characters, the limit of both (admission.py refuses names that then collide or end in '-')."""
    volume = f"lora-{adapter.name}"[:63]
    names = {"volume": volume}
    if parse_source(adapter.source)[0] == "hf":
        names["init container"] = f"download-{volume}"[:63]
    return names


def adapter_volumes(spec: InferenceServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                         list[dict[str, Any]]]:
    """(volumes, the engine container's volumeMounts, init containers) of every adapter."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    inits: list[dict[str, Any]] = []
    for adapter in spec.lora.adapters if spec.lora is not None else []:
        names = pod_names(adapter)
        volume = names["volume"]
        scheme, location, sub_path = parse_source(adapter.source)
        mount: dict[str, Any] = {"name": volume, "mountPath": adapter_path(adapter.name), "readOnly": True}
        if scheme == "pvc":
            volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": location, "readOnly": True}})
            if sub_path:
                mount["subPath"] = sub_path
        elif scheme == "hostPath":
            volumes.append({"name": volume, "hostPath": {"path": location, "type": "Directory"}})
        else:
            volumes.append({"name": volume, "emptyDir": {"sizeLimit": DOWNLOAD_SIZE}})
            inits.append(download_container(spec, names["init container"], location, "/adapter",
                                            [{"name": volume, "mountPath": "/adapter"}],
                                            revision=hf_revision(adapter.source)))
        mounts.append(mount)
    return volumes, mounts, inits


"""Where the checkpoint comes from: spec.model.source -> a pod volume mounted at /model.

`pvc://claim/sub/path` mounts the claim read-only with the sub-path; `hostPath:///dir` mounts a
node directory read-only (only where the admin allows it: policy.py); `hf://org/name` downloads with
an init container that runs the engine image (it ships huggingface_hub), so the engine itself always
starts offline: into `spec.model.cache.claimName` once, reused by every pod and restart, or else into
a size-limited emptyDir of the pod.
"""

from __future__ import annotations

from typing import Any

from flotilla.operator.names import MODEL_PATH
from flotilla.operator.spec import InferenceServiceSpec

VOLUME = "model"
# Where the init container sees a download cache claim.
CACHE_PATH = "/cache"


def parse_source(source: str) -> tuple[str, str, str]:
    """(scheme, location, sub-path) of a model source.

    ("pvc", claim, sub/path), ("hostPath", /dir, "") or ("hf", org/name, "").
    """
    scheme, _, rest = source.partition("://")
    if scheme == "pvc":
        claim, _, sub_path = rest.partition("/")
        return "pvc", claim, sub_path.strip("/")
    if scheme == "hostPath":
        return "hostPath", rest, ""
    if scheme == "hf":
        return "hf", rest, ""
    raise ValueError(f"model.source {source!r} is not pvc://claim/path, hostPath:///path or hf://org/name")


def model_volume(spec: InferenceServiceSpec, cache_size: str) -> tuple[dict[str, Any], dict[str, Any],
                                                                        list[dict[str, Any]]]:
    """(volume, the engine container's volumeMount, init containers) for the model source.

    `cache_size` is the sizeLimit of the per-pod emptyDir an hf:// source downloads into.
    """
    scheme, location, sub_path = parse_source(spec.model.source)
    mount: dict[str, Any] = {"name": VOLUME, "mountPath": MODEL_PATH, "readOnly": True}
    if scheme == "pvc":
        if sub_path:
            mount["subPath"] = sub_path
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": location, "readOnly": True}}, mount, []
    if scheme == "hostPath":
        return {"name": VOLUME, "hostPath": {"path": location, "type": "Directory"}}, mount, []
    claim = spec.model.cache.claim_name if spec.model.cache else None
    # With a claim, the checkpoint lands once under hf/<org>/<name> and every later pod finds it there
    # (snapshot_download skips files already complete); the engine mounts only that directory.
    target = f"{CACHE_PATH}/hf/{location}" if claim else MODEL_PATH
    download = {
        "name": "download-model",
        "image": spec.image,
        "command": ["python3", "-c",
                    "import sys; from huggingface_hub import snapshot_download; "
                    "snapshot_download(sys.argv[1], local_dir=sys.argv[2])",
                    location, target],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [{"name": VOLUME, "mountPath": CACHE_PATH if claim else MODEL_PATH},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if claim:
        mount["subPath"] = f"hf/{location}"
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}, mount, [download]
    return {"name": VOLUME, "emptyDir": {"sizeLimit": cache_size}}, mount, [download]

"""Where the checkpoint comes from: spec.model.source -> a pod volume mounted at /model.

`pvc://claim/sub/path` mounts the claim read-only with the sub-path; `hostPath:///dir` mounts a
node directory read-only; `hf://org/name` downloads into an emptyDir with an init container that
runs the engine image (it ships huggingface_hub), so the engine itself always starts offline.
"""

from __future__ import annotations

from typing import Any

from flotilla.operator.names import MODEL_PATH
from flotilla.operator.spec import InferenceServiceSpec

VOLUME = "model"


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


def model_volume(spec: InferenceServiceSpec) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(volume, the engine container's volumeMount, init containers) for the model source."""
    scheme, location, sub_path = parse_source(spec.model.source)
    mount: dict[str, Any] = {"name": VOLUME, "mountPath": MODEL_PATH, "readOnly": True}
    if scheme == "pvc":
        if sub_path:
            mount["subPath"] = sub_path
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": location, "readOnly": True}}, mount, []
    if scheme == "hostPath":
        return {"name": VOLUME, "hostPath": {"path": location, "type": "Directory"}}, mount, []
    download = {
        "name": "download-model",
        "image": spec.image,
        "command": ["python3", "-c",
                    "import sys; from huggingface_hub import snapshot_download; "
                    "snapshot_download(sys.argv[1], local_dir=sys.argv[2])",
                    location, MODEL_PATH],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [{"name": VOLUME, "mountPath": MODEL_PATH}, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    return {"name": VOLUME, "emptyDir": {}}, mount, [download]

"""The init container that downloads an `hf://` source (model, tokenizer or LoRA adapter) before the engine starts.

It runs the engine image (which ships huggingface_hub) with `snapshot_download`, so the engine itself always starts
offline. A gated or private repository needs a token, and a mirror an endpoint: of spec.pod.env the download gets
exactly the variables huggingface_hub reads for those (`HF_DOWNLOAD_ENV`), as written there (a literal value or a
`valueFrom` Secret/ConfigMap key), and nothing else of the engine's environment. `spec.pod.envFrom` is not passed:
it would hand every key of the Secret or ConfigMap to a container that only needs a token.
"""

from __future__ import annotations

from typing import Any

from flotilla.operator.sandbox import NO_GPUS_ENV, container_security_context
from flotilla.operator.spec import InferenceServiceSpec

# What huggingface_hub reads for a download: the token (HF_TOKEN, or its older name HUGGING_FACE_HUB_TOKEN) and
# the Hub's address (HF_ENDPOINT: a mirror or a private Hub).
HF_DOWNLOAD_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT")

# The download; argv 3 on, when given, narrows it to those files (a GGUF source's one file, a tokenizer's files).
_DOWNLOAD = ("import sys; from huggingface_hub import snapshot_download; "
             "snapshot_download(sys.argv[1], local_dir=sys.argv[2], allow_patterns=sys.argv[3:] or None)")
# The same at a revision (argv 3; the files from argv 4). A program of its own, so the pods of unpinned sources keep
# their template (an operator upgrade rolls no Deployment).
_DOWNLOAD_AT = ("import sys; from huggingface_hub import snapshot_download; "
                "snapshot_download(sys.argv[1], revision=sys.argv[3], local_dir=sys.argv[2], "
                "allow_patterns=sys.argv[4:] or None)")


def download_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The download container's environment: HOME on the writable /tmp, no GPUs (it requests none, and the image is
    the InferenceService author's: sandbox.NO_GPUS_ENV), then spec.pod.env's HF_DOWNLOAD_ENV entries in their order
    there."""
    forwarded = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.pod.env if e.name in HF_DOWNLOAD_ENV]
    return [{"name": "HOME", "value": "/tmp"}, dict(NO_GPUS_ENV), *forwarded]


def download_container(spec: InferenceServiceSpec, name: str, repo: str, target: str,
                       mounts: list[dict[str, Any]], patterns: tuple[str, ...] = (),
                       revision: str | None = None) -> dict[str, Any]:
    """An init container named `name` that downloads `repo` (org/name) at `revision` (default: its default branch)
    into `target` (only `patterns`, when given); `mounts` are its volumeMounts besides /tmp."""
    command = ["python3", "-c", _DOWNLOAD, repo, target, *patterns] if revision is None else \
        ["python3", "-c", _DOWNLOAD_AT, repo, target, revision, *patterns]
    return {
        "name": name,
        "image": spec.image,
        "command": command,
        "env": download_env(spec),
        "volumeMounts": [*mounts, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": container_security_context(),
    }

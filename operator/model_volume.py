"""Where the checkpoint comes from: spec.model.source -> a pod volume mounted at /model.

`pvc://claim/sub/path` mounts the claim read-only with the sub-path; `hostPath:///dir` mounts a
node directory read-only (only where the admin allows it: policy.py); a `.gguf` file on either is mounted
alone at /model/<file name>, the engine's MODEL argument; `hf://org/name` (or one file of it,
`hf://org/name/path/model.gguf`, downloaded alone to /model/path/model.gguf; `hf://org/name:revision` pins a
revision, as KServe's storageUri does, so every replica and restart serves the same files) downloads with
an init container that runs the engine image (hf_download.py: it gets spec.pod.env's HF_TOKEN,
HUGGING_FACE_HUB_TOKEN and HF_ENDPOINT, nothing else), so the engine itself always starts offline: into
`spec.model.cache.claimName` once, reused by every pod and restart, or else into a size-limited emptyDir of the pod.

spec.model.tokenizer, an HF tokenizer directory in the same forms, is mounted read-only at /tokenizer
(`tokenizer_volume`); of an hf:// repository only the tokenizer's files are downloaded.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from flotilla.operator.hf_download import download_container
from flotilla.operator.names import MODEL_PATH, TOKENIZER_PATH
from flotilla.operator.spec import InferenceServiceSpec, hf_revision, parse_source

VOLUME = "model"
# Where the init container sees a download cache claim.
CACHE_PATH = "/cache"
TOKENIZER_VOLUME = "tokenizer"
# What a tokenizer needs of a repository (tokenizer.json/config, vocab and merges, a SentencePiece model,
# generation_config.json, a chat template), not its weights.
TOKENIZER_FILES = ("*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken")
TOKENIZER_DOWNLOAD_SIZE = "1Gi"


def model_path(spec: InferenceServiceSpec) -> str:
    """The engine's MODEL argument: /model (the checkpoint directory), or the GGUF file under it."""
    scheme, _, sub_path = parse_source(spec.model.source)
    gguf = spec.model.gguf_file
    if gguf is None:
        return MODEL_PATH
    # A repository's file keeps its path in the download; a claim's or node's file is mounted alone, by its name.
    return f"{MODEL_PATH}/{sub_path if scheme == 'hf' else PurePosixPath(gguf).name}"


def model_volume(spec: InferenceServiceSpec, cache_size: str) -> tuple[dict[str, Any], dict[str, Any],
                                                                        list[dict[str, Any]]]:
    """(volume, the engine container's volumeMount, init containers) for the model source.

    `cache_size` is the sizeLimit of the per-pod emptyDir an hf:// source downloads into. A GGUF file on a
    claim or a node is mounted alone (a file sub-path, a hostPath of type File) at `model_path`: the pod sees
    that file and nothing beside it, exactly what the source names (and, for hostPath, what the policy allowed).
    """
    scheme, location, sub_path = parse_source(spec.model.source)
    gguf = spec.model.gguf_file is not None and scheme != "hf"
    mount: dict[str, Any] = {"name": VOLUME, "mountPath": model_path(spec) if gguf else MODEL_PATH, "readOnly": True}
    if scheme == "pvc":
        if sub_path:
            mount["subPath"] = sub_path
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": location, "readOnly": True}}, mount, []
    if scheme == "hostPath":
        return {"name": VOLUME, "hostPath": {"path": location, "type": "File" if gguf else "Directory"}}, mount, []
    claim = spec.model.cache.claim_name if spec.model.cache else None
    revision = hf_revision(spec.model.source)
    # With a claim, the checkpoint lands once under hf/<org>/<name> (hf/<org>/<name>@<revision> when pinned: no file
    # of another revision beside it) and every later pod finds it there (snapshot_download skips files already
    # complete); the engine mounts only that directory.
    cached = f"hf/{location}" if revision is None else f"hf/{location}@{revision}"
    target = f"{CACHE_PATH}/{cached}" if claim else MODEL_PATH
    download = download_container(spec, "download-model", location, target,
                                  [{"name": VOLUME, "mountPath": CACHE_PATH if claim else MODEL_PATH}],
                                  (sub_path,) if sub_path else (), revision)
    if claim:
        mount["subPath"] = cached
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}, mount, [download]
    return {"name": VOLUME, "emptyDir": {"sizeLimit": cache_size}}, mount, [download]


def tokenizer_volume(spec: InferenceServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                          list[dict[str, Any]]]:
    """(volumes, the engine container's volumeMounts, init containers) of spec.model.tokenizer (none without it):
    mounted read-only at /tokenizer like a model directory; of an hf:// repository only TOKENIZER_FILES, into an
    emptyDir of the pod."""
    source = spec.model.tokenizer
    if source is None:
        return [], [], []
    scheme, location, sub_path = parse_source(source)
    mount: dict[str, Any] = {"name": TOKENIZER_VOLUME, "mountPath": TOKENIZER_PATH, "readOnly": True}
    if scheme == "pvc":
        if sub_path:
            mount["subPath"] = sub_path
        return [{"name": TOKENIZER_VOLUME, "persistentVolumeClaim": {"claimName": location, "readOnly": True}}], \
            [mount], []
    if scheme == "hostPath":
        return [{"name": TOKENIZER_VOLUME, "hostPath": {"path": location, "type": "Directory"}}], [mount], []
    download = download_container(spec, "download-tokenizer", location, TOKENIZER_PATH,
                                  [{"name": TOKENIZER_VOLUME, "mountPath": TOKENIZER_PATH}], TOKENIZER_FILES,
                                  hf_revision(source))
    return [{"name": TOKENIZER_VOLUME, "emptyDir": {"sizeLimit": TOKENIZER_DOWNLOAD_SIZE}}], [mount], [download]

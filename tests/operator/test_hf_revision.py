"""An hf:// source pinned to a revision, as KServe's storageUri writes it (`hf://org/name:revision`): the schema and the
review take it, every download (model, GGUF file, tokenizer, adapters) fetches that revision, a download cache keeps it
apart from other revisions, and an unpinned source's pods keep the template they had."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from typing import Any, ClassVar

import pytest

from flotilla.operator.admission import review
from flotilla.operator.kube import KubeError
from flotilla.operator.reconciler import Reconciler

from .conftest import FIS_PATH
from .test_deployment import build, pod
from .test_operator_reconcile import child_path

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
# The download program of an unpinned source, as operators before pinning rendered it: unchanged, so that upgrading
# the operator rolls no Deployment of an unpinned InferenceService.
UNPINNED_PROGRAM = ("import sys; from huggingface_hub import snapshot_download; "
                    "snapshot_download(sys.argv[1], local_dir=sys.argv[2], allow_patterns=sys.argv[3:] or None)")


def downloads(d: dict[str, Any]) -> dict[str, list[str]]:
    """Each init container's arguments after the program: repository, target, revision (when pinned), files."""
    return {c["name"]: c["command"][3:] for c in pod(d)["initContainers"]}


def test_a_pinned_source_downloads_that_revision(validate_manifest):
    d = build(model={"source": f"hf://meta-llama/Llama-3.1-8B-Instruct:{COMMIT}", "tokenizer": "hf://org/tok:v2"},
              lora={"adapters": [{"name": "sql", "source": "hf://org/sql-lora:main"}]})
    assert downloads(d) == {
        "download-model": ["meta-llama/Llama-3.1-8B-Instruct", "/model", COMMIT],
        "download-tokenizer": ["org/tok", "/tokenizer", "v2", "*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"],
        "download-lora-sql": ["org/sql-lora", "/adapter", "main"]}
    assert all("revision=sys.argv[3]" in c["command"][2] for c in pod(d)["initContainers"])
    validate_manifest(d)


def test_a_pinned_gguf_file_downloads_that_revision_of_the_file():
    d = build(model={"source": "hf://org/llama-gguf:v1.0/q4/llama-8b.Q4_1.gguf"})
    assert downloads(d) == {"download-model": ["org/llama-gguf", "/model", "v1.0", "q4/llama-8b.Q4_1.gguf"]}
    assert pod(d)["containers"][0]["args"][0] == "/model/q4/llama-8b.Q4_1.gguf"


def test_a_download_cache_keeps_each_revision_apart(validate_manifest):
    """With a cache claim, a pinned revision lands in hf/<org>/<name>@<revision>, which the engine mounts alone: no file
    of the default branch or another revision (one it deleted, say) beside it."""
    d = build(model={"source": f"hf://org/model:{COMMIT}", "cache": {"claimName": "hf-cache"}})
    assert downloads(d) == {"download-model": ["org/model", f"/cache/hf/org/model@{COMMIT}", COMMIT]}
    assert pod(d)["containers"][0]["volumeMounts"][0]["subPath"] == f"hf/org/model@{COMMIT}"
    unpinned = build(model={"source": "hf://org/model", "cache": {"claimName": "hf-cache"}})
    assert pod(unpinned)["containers"][0]["volumeMounts"][0]["subPath"] == "hf/org/model"
    validate_manifest(d)


def test_an_unpinned_source_keeps_its_download_command():
    d = build(model={"source": "hf://org/model"}, lora={"adapters": [{"name": "a", "source": "hf://org/a"}]})
    assert [c["command"] for c in pod(d)["initContainers"]] == [
        ["python3", "-c", UNPINNED_PROGRAM, "org/model", "/model"],
        ["python3", "-c", UNPINNED_PROGRAM, "org/a", "/adapter"]]


@pytest.mark.parametrize("source", [f"hf://org/model:{COMMIT}", "hf://org/model:main", "hf://org/model:v1.0_rc-2",
                                    "hf://org/model:" + "a" * 100])
def test_the_review_takes_a_revision(source):
    spec = {"model": {"source": source, "tokenizer": source}, "lora": {"adapters": [{"name": "a", "source": source}]}}
    assert review(spec, "llama").errors == []


# Empty; a branch with '/' (refs/pr/1: pin its commit instead); not starting with a letter or digit; two colons; past
# 100 characters; on a pvc:// or hostPath:// source a colon is part of the path, so those are not listed.
BAD = ["hf://org/model:", "hf://org/model:refs/pr/1", "hf://org/model:-x", "hf://org/model::x", "hf://org:x/model",
       "hf://org/model:" + "a" * 101]


@pytest.mark.parametrize("source", BAD)
def test_the_review_refuses_a_malformed_revision(source):
    errors = review({"model": {"source": source}}, "llama").errors
    assert len(errors) == 1 and errors[0].startswith("spec.model.source"), errors


def test_engine_args_revision_points_to_the_source():
    errors = review({"model": {"source": "hf://org/model"}, "engineArgs": ["--revision", "abc"]}, "llama").errors
    assert len(errors) == 1 and "hf://org/name:revision" in errors[0], errors


def test_the_apiserver_takes_a_pinned_source_and_the_reconcile_downloads_it(cluster, namespace):
    """On the real apiserver (1.20): the CRD's pattern takes `hf://org/name:revision` and refuses a malformed one, and
    the operator's reconcile makes a Deployment whose download fetches that revision."""
    body = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "pinned", "namespace": namespace},
            "spec": {"model": {"source": f"hf://org/model:{COMMIT}"}}}
    for bad in ("hf://org/model:", "hf://org/model:refs/pr/1"):
        refused = {**body, "spec": {"model": {"source": bad}}}
        with pytest.raises(KubeError) as e:
            cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices", refused,
                                 {"dryRun": "All"})
        assert e.value.status == 422 and "spec.model.source" in e.value.message
    cluster.apply(body)
    try:
        Reconciler(cluster.kube, post_event=lambda *_: None).reconcile(namespace, "pinned")
    except KubeError as e:  # the session's operator, once an earlier test started it, reconciles the same object:
        if e.status != 409:  # its children then exist already (the reconciler only creates, so a 409 is theirs)
            raise
    deadline = time.monotonic() + 60
    while (deployment := cluster.kube.get(child_path("Deployment", namespace, "pinned"))) is None:
        assert time.monotonic() < deadline, "no Deployment was made for the pinned source"
        time.sleep(0.2)
    assert downloads(deployment) == {"download-model": ["org/model", "/model", COMMIT]}


class _Hub(http.server.BaseHTTPRequestHandler):
    """Notes the paths asked for and answers 404: enough to see which revision huggingface_hub asks the Hub for."""

    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Hub.paths.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize(("source", "revision"), [(f"hf://org/model:{COMMIT}", COMMIT), ("hf://org/model", "main")])
def test_the_download_asks_the_hub_for_the_revision(source, revision, tmp_path):
    """The init container's own command, run with the real huggingface_hub against an address that notes the request
    (HF_ENDPOINT, as a mirror is given): the pinned revision is what it asks for (unpinned: the default branch)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hub.paths = []
    try:
        command = pod(build(model={"source": source}))["initContainers"][0]["command"]
        command = [sys.executable, *command[1:3], command[3], str(tmp_path / "model"), *command[5:]]
        env = {"HOME": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
               "HF_HUB_DISABLE_TELEMETRY": "1", "PATH": "/usr/bin:/bin"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode != 0  # the stand-in Hub has no such repository
    # /api/models/org/model/revision/<revision> or, in newer huggingface_hub releases, /tree/<revision>.
    asked = [p.split("?")[0].split("/") for p in _Hub.paths if p.startswith("/api/models/org/model/")]
    assert asked and all(segments[6:7] == [revision] for segments in asked), (_Hub.paths, done.stderr[-2000:])

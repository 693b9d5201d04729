"""kopf's last-handled record as a digest (operator/diffbase.py): what kopf compares, and a spec too large for an
annotation on the real apiserver."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf

from flotilla.operator.diffbase import DIGEST_KEY, CheckedProgressStorage, DigestDiffBaseStorage

from .conftest import wait_for
from .test_operator_reconcile import child_path, fis_path, fixed, wait_children
from .test_operator_webhook import bulk_env

ANNOTATION = "serving.flotilla.dev/last-handled-configuration"


def _body(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> kopf.Body:
    return kopf.Body({"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
                      "metadata": {"name": "m", "namespace": "n", "annotations": annotations or {}}, "spec": spec})


def _stored(storage: DigestDiffBaseStorage, body: kopf.Body) -> dict[str, str]:
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    return {key: value for key, value in patch["metadata"]["annotations"].items() if value is not None}


def test_the_stored_record_is_a_digest_that_tells_a_change_from_none() -> None:
    storage = DigestDiffBaseStorage()
    spec = {"model": {"source": "hf://m"}, "pod": {"env": bulk_env("a", 500_000)}}
    annotations = _stored(storage, _body(spec))
    assert len(annotations[ANNOTATION]) < 100 and set(json.loads(annotations[ANNOTATION])) == {DIGEST_KEY}
    same = _body(copy.deepcopy(spec), annotations)
    assert storage.fetch(body=same) == storage.build(body=same)  # no change: kopf sees no diff
    changed = _body({**spec, "replicas": 3}, annotations)
    assert storage.fetch(body=changed) not in (None, storage.build(body=changed))  # a change: a diff
    assert storage.fetch(body=_body(spec)) is None  # never handled: kopf's creation


def test_a_whole_essence_an_earlier_operator_stored_is_compared_as_before() -> None:
    storage = DigestDiffBaseStorage()
    spec = {"model": {"source": "hf://m"}}
    whole = {ANNOTATION: json.dumps(storage.build(body=_body(spec)))}
    assert storage.fetch(body=_body(spec, whole)) == storage.build(body=_body(spec, whole))
    assert storage.fetch(body=_body({**spec, "replicas": 3}, whole)) == {"spec": spec}


def test_a_spec_too_large_for_kopfs_annotation_is_handled_and_updated(operator_process, cluster, namespace) -> None:
    """About the largest spec the webhook admits (1.3 MB of engine environment, near etcd's 1.5 MiB): kopf's full copy
    of it could not be annotated (422 Too long), so kopf logged an error and throttled the object at every event. Now
    its record is a digest: stored, and replaced when kopf handles an update (the resync never writes it)."""
    name = "huge"
    body = fixed(name, namespace)
    body["spec"]["pod"] = {"env": bulk_env("a", 1_300_000)}
    cluster.apply(body)
    wait_children(cluster, namespace, name, ["Deployment"])
    path = fis_path(namespace, name)

    def record() -> str | None:
        return ((cluster.kube.get(path) or {})["metadata"].get("annotations") or {}).get(ANNOTATION)

    first = wait_for(record, 30, "kopf's last-handled record of the large InferenceService")
    assert len(first) < 100
    cluster.kube.request("PATCH", path, {"spec": {"replicas": 3}}, content_type="application/merge-patch+json")
    wait_for(lambda: (record() or first) != first, 30, "kopf's record of the update")
    deployment = wait_for(lambda: (d := cluster.kube.get(child_path("Deployment", namespace, name)))
                          and d["spec"]["replicas"] == 3 and d, 30, "the Deployment at 3 replicas")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert sum(len(env[e["name"]]) for e in body["spec"]["pod"]["env"]) == 1_300_000
    log = operator_process.log_path.read_text(errors="replace")
    assert "metadata.annotations: Too long" not in log


def test_records_that_are_not_kopfs_read_as_absent():
    # The author of an InferenceService can write kopf's annotations; kopf raised on every event decoding them.
    spec = {"model": {"source": "pvc://m/x"}}
    storage = DigestDiffBaseStorage()
    for junk in ("{not json", "5", "[1]", '"text"', '{"other": 1}'):
        assert storage.fetch(body=_body(spec, {ANNOTATION: junk})) is None, junk
    progress = CheckedProgressStorage()
    key = kopf.HandlerId("reconcile")
    good = {"started": "2026-12-07T01:05:01.334000+00:00", "retries": 2, "success": False, "message": "x",
            "subrefs": ["a"]}
    assert progress.fetch(key=key, body=_body(spec, {"serving.flotilla.dev/reconcile": json.dumps(good)})) == good
    for junk in ("[1", "[1]", '{"retries": "many"}', '{"delayed": "tomorrow"}', '{"started": 5}',
                 '{"success": "yes"}', '{"subrefs": [1]}', '{"retries": true}',
                 # datetime.fromisoformat reads these, kopf does not: a time with no offset (kopf compared it with its
                 # own and raised TypeError), a week date (iso8601's ParseError); and retries below 0 (no backoff)
                 '{"delayed": "2026-12-07T01:05:01"}', '{"started": "2026-12-07T01:05:01"}',
                 '{"started": "2026-W49-1"}', '{"retries": -100000}'):
        body = _body(spec, {"serving.flotilla.dev/reconcile": junk})
        assert progress.fetch(key=key, body=body) is None, junk

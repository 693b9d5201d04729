"""The InferenceService CRD: generated from the spec model, committed, and enforced by a real apiserver."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from flotilla.flags import FLAGS
from flotilla.operator.crd import build_crd, crd_yaml
from flotilla.operator.engine_args import FIELD_VALUES
from flotilla.operator.spec import GROUP, PLURAL, VERSION, InferenceServiceSpec
from flotilla.operator.status import InferenceServiceStatus

from .conftest import WEBHOOK_CONFIGURATION

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / f"{PLURAL}.{GROUP}.yaml"
SAMPLES = sorted((REPO / "crds" / "samples").glob("*.yaml"))


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    for part in dotted.split("."):
        schema = schema["properties"][part]
    return schema


def _model_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(camelCase dotted path, annotation) of every field of a pydantic model, nested models included."""
    paths = []
    for field in model.model_fields.values():
        path = f"{prefix}{field.alias}"
        paths.append((path, field.annotation))
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            inner = getattr(arg, "__args__", (arg,))[0] if getattr(arg, "__origin__", None) is list else arg
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                paths += _model_paths(inner, path + ".")
    return paths


def test_committed_crd_is_the_generated_one():
    assert CRD_FILE.read_text() == crd_yaml(), (
        "crds/ is stale: run `python -m flotilla.operator.crd > " + str(CRD_FILE.relative_to(REPO)) + "`")


def test_crd_is_a_valid_v1_crd(validate_manifest):
    validate_manifest(yaml.safe_load(CRD_FILE.read_text()))


@pytest.mark.parametrize(("model", "root"), [(InferenceServiceSpec, "spec"), (InferenceServiceStatus, "status")])
def test_every_model_field_is_in_the_schema_with_a_description(model, root):
    schema = _at(_schema(), root)
    for path, _ in _model_paths(model):
        node = schema
        for part in path.split("."):
            node = node.get("items", node)["properties"][part]
        assert node.get("description"), f"{root}.{path} has no description"


def test_schema_is_structural():
    def walk(node: dict[str, Any], where: str) -> None:
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{where} has no type"
        for bad in ("anyOf", "oneOf", "$ref", "$defs", "title"):
            assert bad not in node, f"{where} has {bad}"
        for name, child in node.get("properties", {}).items():
            walk(child, f"{where}.{name}")
        if "items" in node:
            walk(node["items"], f"{where}[]")

    walk(_schema()["properties"]["spec"], "spec")
    walk(_schema()["properties"]["status"], "status")


def test_every_field_of_an_engine_flag_exists_in_the_crd():
    for flag in FLAGS:
        if flag.crd_field:
            assert _at(_schema()["properties"]["spec"], flag.crd_field), flag.crd_field


def test_crd_defaults_are_the_engine_defaults():
    """A spec that sets nothing gives each flag the engine's own default (the CRD doesn't override it)."""
    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m"}})
    for flag in FLAGS:
        if flag.crd_field and flag.crd_field != "model.servedName":
            assert FIELD_VALUES[flag.crd_field](spec, "x") in (flag.default, False if flag.default is None else ...), \
                flag.name


def test_enums_are_within_the_flag_choices():
    spec_schema = _schema()["properties"]["spec"]
    for flag in FLAGS:
        if flag.crd_field and flag.choices:
            enum = set(_at(spec_schema, flag.crd_field)["enum"]) - {"none"}
            assert enum <= set(flag.choices), (flag.name, enum - set(flag.choices))


def test_printer_columns_and_subresources():
    version = build_crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == \
        ["Ready", "Reason", "Replicas", "Model", "GPUs", "Queue", "KV %", "Tok/s", "TTFT-P95", "URL", "Age"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert build_crd()["spec"]["names"]["shortNames"] == ["fis"]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_samples_parse_and_use_only_implemented_flags(sample):
    from flotilla.operator.engine_args import unsupported

    doc = yaml.safe_load(sample.read_text())
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
    spec = InferenceServiceSpec.model_validate(doc["spec"])
    assert unsupported(spec, doc["metadata"]["name"]) == []


# --- on the real control plane -------------------------------------------------------------------

@pytest.fixture(scope="module")
def crd_installed(kube_api):
    import kubernetes

    ext = kubernetes.client.ApiextensionsV1Api(kube_api)
    try:
        ext.create_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text()))
    except kubernetes.client.ApiException as e:
        if e.status != 409:  # already installed by the operator's tests in this session
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        if conditions.get("Established") == "True":
            break
        time.sleep(0.1)
    else:
        pytest.fail("CRD not Established within 30 s")
    api = kubernetes.client.CustomObjectsApi(kube_api)
    # Discovery catches up with a just-established CRD: the kind is served once a list answers (a fixed 0.5 s
    # sleep could be too short on a loaded machine, and the first create got a 404).
    deadline = time.monotonic() + 30
    while True:
        try:
            api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
            break
        except kubernetes.client.ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with _webhooks_set_aside(kube_api):
        yield api


@contextlib.contextmanager
def _webhooks_set_aside(kube_api) -> Iterator[None]:
    """The operator's admission webhook configurations, when a live operator registered them earlier in the session
    (test_operator_webhook.py run first), taken away while these tests run and put back after: the tests here check
    the apiserver's own schema defaulting and validation, which the mutating webhook would add to (served name,
    GPUs) and the validating one pre-empt."""
    import kubernetes

    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    kinds = [(adm.read_mutating_webhook_configuration, adm.delete_mutating_webhook_configuration,
              adm.create_mutating_webhook_configuration),
             (adm.read_validating_webhook_configuration, adm.delete_validating_webhook_configuration,
              adm.create_validating_webhook_configuration)]
    saved = []
    for read, delete, create in kinds:
        try:
            config = read(WEBHOOK_CONFIGURATION)
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
            continue
        delete(WEBHOOK_CONFIGURATION)
        config.metadata = kubernetes.client.V1ObjectMeta(name=WEBHOOK_CONFIGURATION, labels=config.metadata.labels,
                                                         annotations=config.metadata.annotations)
        saved.append((create, config))
    try:
        yield
    finally:
        for create, config in saved:
            create(config)


def _create(api, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_apiserver_accepts_samples_and_fills_the_same_defaults_as_the_model(crd_installed, namespace, sample):
    doc = yaml.safe_load(sample.read_text())
    stored = _create(crd_installed, namespace, doc)
    # The apiserver's defaulting and the pydantic model's defaults must agree field by field.
    assert _without_empty(stored["spec"]) == _without_empty(InferenceServiceSpec.model_validate(doc["spec"]).model_dump(
        by_alias=True, exclude_none=True, mode="json"))
    assert InferenceServiceSpec.model_validate(stored["spec"]) == InferenceServiceSpec.model_validate(doc["spec"])


def _without_empty(node: Any) -> Any:
    # The model fills empty lists and maps (engineArgs, tolerations, ...); the apiserver leaves them out,
    # and defaults an object whose fields have no defaults (spec.pod) to {}.
    if isinstance(node, dict):
        inner = {k: _without_empty(v) for k, v in node.items()}
        return {k: v for k, v in inner.items() if v not in ([], {})}
    return node


def test_apiserver_fills_defaults_of_a_minimal_spec(crd_installed, namespace):
    stored = _create(crd_installed, namespace, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": "tiny"},
        "spec": {"model": {"source": "hostPath:///models/tiny"}}})
    spec = stored["spec"]
    assert spec["replicas"] == 1  # always present, so the scale subresource can answer (README)
    assert spec["quantization"] == "none"
    assert spec["kvCache"] == {"dtype": "auto", "blockSize": 16, "gpuMemoryUtilization": 0.9, "prefixCaching": True,
                               "calculateScales": False}
    assert spec["scheduling"] == {"maxNumSeqs": 256, "chunkedPrefill": False}
    assert spec["parallelism"] == {"tensor": 1, "pipeline": 1}
    assert spec["resources"] == {"shmSize": "8Gi", "tmpSize": "20Gi"}
    assert spec["rollout"] == {"maxSurge": 1, "maxUnavailable": 0, "progressDeadlineSeconds": 600}
    assert spec["monitoring"] == {"serviceMonitor": True, "interval": "15s"}
    assert "autoscaling" not in spec and "speculative" not in spec and "lora" not in spec


GOOD = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": "bad"},
        "spec": {"model": {"source": "pvc://models/llama"}}}

# (what to change in GOOD's spec, the apiserver's user-facing message, as kubectl prints it)
BAD = [
    ({"replicas": "two"}, 'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer'),
    ({"replicas": -1}, "spec.replicas in body should be greater than or equal to 0"),
    ({"kvCache": {"blockSize": 7}}, 'spec.kvCache.blockSize: Unsupported value: 7: supported values: "8", "16", '
                                    '"32", "64", "128"'),
    ({"kvCache": {"gpuMemoryUtilization": 1.5}},
     "spec.kvCache.gpuMemoryUtilization in body should be less than or equal to 1"),
    ({"kvCache": {"gpuMemoryUtilization": 0}},
     "spec.kvCache.gpuMemoryUtilization in body should be greater than 0"),
    ({"quantization": "fp4"}, 'spec.quantization: Unsupported value: "fp4": supported values: "none", "fp8", '
                              '"int8", "rtn", "awq", "gptq", "compressed-tensors"'),
    ({"model": {"source": "s3://bucket/llama"}}, "spec.model.source in body should match"),
    ({"model": {"servedName": "x"}}, "spec.model.source: Required value"),
    ({"parallelism": {"tensor": 0}}, "spec.parallelism.tensor in body should be greater than or equal to 1"),
    ({"autoscaling": {"minReplicas": 1}}, "spec.autoscaling.maxReplicas: Required value"),
    ({"autoscaling": {"maxReplicas": 2, "metric": "gpu_util"}}, 'spec.autoscaling.metric: Unsupported value: '
                                                               '"gpu_util"'),
    ({"scheduling": {"maxNumSeqs": 0}}, "spec.scheduling.maxNumSeqs in body should be greater than or equal to 1"),
    ({"monitoring": {"interval": "soon"}}, "spec.monitoring.interval in body should match"),
    ({"engineArgs": "--enforce-eager"}, 'spec.engineArgs: Invalid value: "string": spec.engineArgs in body must be '
                                        "of type array"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[str(c) for c, _ in BAD])
def test_pydantic_model_refuses_what_the_apiserver_refuses(change, message):
    spec = copy.deepcopy(GOOD["spec"]) | change
    with pytest.raises(ValidationError):
        InferenceServiceSpec.model_validate(spec)


def test_apiserver_refuses_bad_specs_with_a_user_facing_message(crd_installed, namespace):
    import kubernetes

    for change, message in BAD:
        doc = copy.deepcopy(GOOD)
        doc["spec"] |= change
        with pytest.raises(kubernetes.client.ApiException) as refused:
            _create(crd_installed, namespace, doc)
        assert refused.value.status == 422, change
        assert message in json.loads(refused.value.body)["message"], (change, refused.value.body)


def test_status_shows_in_printer_columns_and_scale_subresource(crd_installed, namespace, kube_api):
    _create(crd_installed, namespace, {**GOOD, "metadata": {"name": "shown"}, "spec": {
        "model": {"source": "pvc://models/llama", "servedName": "llama"}, "replicas": 2}})
    crd_installed.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "shown", {"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}],
        "replicas": 2, "readyReplicas": 2, "gpus": 2, "selector": "serving.flotilla.dev/inferenceservice=shown",
        "url": "http://shown.ns.svc.cluster.local:8000",
        "serving": {"running": 4, "waiting": 3, "kvCacheUsagePercent": 41.5, "generationTokensPerSecond": 120.5,
                    "ttftP95Seconds": 0.25, "windowSeconds": 60, "observedAt": "2026-12-03T10:00:00Z",
                    "scraped": 2, "replicas": [{"pod": "shown-a", "running": 2, "waiting": 1}]}}})
    # What `kubectl get fis` asks for: the server-side table built from additionalPrinterColumns.
    method, url, headers, body, _ = kube_api.param_serialize(
        "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, auth_settings=["BearerToken"])
    response = kube_api.call_api(method, url, header_params=headers, body=body)
    response.read()
    table = json.loads(response.data)
    assert [c["name"] for c in table["columnDefinitions"]] == \
        ["Name", "Ready", "Reason", "Replicas", "Model", "GPUs", "Queue", "KV %", "Tok/s", "TTFT-P95", "URL", "Age"]
    assert table["rows"][0]["cells"][:11] == ["shown", "True", "AllReplicasReady", 2, "llama", 2, 3, 41.5, 120.5, 0.25,
                                              "http://shown.ns.svc.cluster.local:8000"]
    scale = crd_installed.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "shown")
    assert scale["spec"]["replicas"] == 2
    assert scale["status"]["selector"] == "serving.flotilla.dev/inferenceservice=shown"

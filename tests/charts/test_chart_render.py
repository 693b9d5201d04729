"""charts/flotilla rendered offline (helm-python-sdk): lint, schemas, values, and the contracts with the
operator (its CLI flags, its webhook handler ids, its CRD)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from flotilla.operator import main as operator_main
from flotilla.operator import webhook
from flotilla.operator.policy import AdmissionPolicy
from flotilla.operator.spec import DEFAULT_PROMETHEUS_ADDRESS

from ..k8s_fixtures import REPO
from .conftest import CHART, NAMESPACE, RELEASE, find, render_chart

# Values that change every branch of the templates.
NON_DEFAULT = {
    "fullnameOverride": "llm-serving",
    "operator": {
        "image": {"repository": "registry.local/flotilla-operator", "tag": "dev", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "watchNamespaces": ["team-a", "team-*"],
        "logLevel": "debug",
        "resyncSeconds": 30,
        "resyncConcurrency": 4,
        "hostPath": {"allowedPrefixes": ["/models", "/mnt/checkpoints"]},
        "engineAnnotations": {"allowed": ["prometheus.io/", "sidecar.istio.io/inject"]},
        "engineLabels": {"allowed": ["example.com/", "sidecar.istio.io/inject"]},
        "priorityClasses": {"allowed": ["inference", "inference-batch"]},
        "serviceAccounts": {"allowed": ["model-reader", "default"]},
        "keda": {"prometheusAddresses": ["http://prometheus.obs.svc:9090", "https://thanos.obs.svc/query"]},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "podLabels": {"team": "ml"},
        "podAnnotations": {"example.com/owner": "ml-platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "healthPort": 8081,
    },
    "serviceAccount": {"name": "flotilla-sa", "annotations": {"example.com/role": "operator"}},
    "engine": {"image": {"repository": "registry.local/flotilla-engine", "tag": "0.1.0-mirror"}},
    "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 5, "port": 8443, "servicePort": 8443,
                "tls": {"mode": "secret", "secretName": "flotilla-webhook-cert",
                        "certManagerCertificate": "serving/flotilla-webhook"}},
    "prometheusAdapter": {"rules": {"enabled": True, "metrics": ["num_requests_waiting"]}},
}
VALUE_SETS = {"default": {}, "non-default": NON_DEFAULT}


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("which", VALUE_SETS)
def test_lint_strict_is_clean(which: str) -> None:
    import helm_python

    for kube_version in ("v1.20.0", "v1.30.0"):
        report = helm_python.lint(CHART, VALUE_SETS[which], strict=True, namespace=NAMESPACE,
                                  kube_version=kube_version)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


@pytest.mark.parametrize("which", VALUE_SETS)
def test_every_rendered_object_is_valid_kubernetes(which: str, validate_manifest: Any) -> None:
    objects, _ = render_chart(VALUE_SETS[which])
    assert objects
    for obj in objects:
        validate_manifest(obj)


def test_crd_in_chart_is_the_repository_crd() -> None:
    chart_crd = CHART / "crds" / "inferenceservices.serving.flotilla.dev.yaml"
    assert chart_crd.read_bytes() == (REPO / "crds" / "inferenceservices.serving.flotilla.dev.yaml").read_bytes(), \
        "charts/flotilla/crds/ must be a copy of crds/: cp crds/inferenceservices.serving.flotilla.dev.yaml " \
        "charts/flotilla/crds/"
    assert [p.name for p in (CHART / "crds").iterdir()] == [chart_crd.name]


def test_default_render_has_the_operator_and_its_webhooks() -> None:
    objects, notes = render_chart()
    kinds = [o["kind"] for o in objects]
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "Secret",
                 "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert kinds.count(kind) == 1, kind
    deployment = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == find(objects, "ServiceAccount")["metadata"]["name"]
    binding = find(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == find(objects, "ClusterRole")["metadata"]["name"]
    container = operator_container(objects)
    assert container["image"] == "ghcr.io/flotilla-dev/flotilla-operator:0.1.0"
    assert "--engine-image=ghcr.io/flotilla-dev/flotilla-engine:0.1.0" in container["args"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in find(objects, kind)["webhooks"]:
            assert hook["failurePolicy"] == "Ignore"
            assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert "kubectl get fis" in notes and "rollout status deployment/flotilla-operator" in notes


def test_image_tags_default_to_the_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    objects, _ = render_chart({"operator": {"image": {"repository": "r/op"}},
                               "engine": {"image": {"repository": "r/en"}}})
    container = operator_container(objects)
    assert container["image"] == f"r/op:{app_version}"
    assert f"--engine-image=r/en:{app_version}" in container["args"]


def test_image_digests_pin_both_images() -> None:
    # A digest pins the exact image (supply-chain policies ask for it); the tag then plays no part.
    digest = "sha256:" + "ab" * 32
    objects, notes = render_chart({"operator": {"image": {"repository": "r/op", "tag": "t", "digest": digest}},
                                   "engine": {"image": {"repository": "r/en", "digest": digest}}})
    container = operator_container(objects)
    assert container["image"] == f"r/op@{digest}"
    assert f"--engine-image=r/en@{digest}" in container["args"]
    assert f"r/op@{digest}" in notes and f"r/en@{digest}" in notes


def test_non_default_values_reach_the_objects() -> None:
    objects, notes = render_chart(NON_DEFAULT)
    deployment = find(objects, "Deployment", "llm-serving-operator")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.local/flotilla-operator:dev" and container["imagePullPolicy"] == "Always"
    assert pod["serviceAccountName"] == "flotilla-sa" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated" and "nodeAffinity" in pod["affinity"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    args = container["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-*"]
    assert "--debug" in args and "--resync-seconds=30" in args and "--webhook-port=8443" in args
    assert "--resync-concurrency=4" in args
    assert "--engine-image=registry.local/flotilla-engine:0.1.0-mirror" in args
    assert "--liveness=http://0.0.0.0:8081/healthz" in args
    assert pod["volumes"][0]["secret"]["secretName"] == "flotilla-webhook-cert"
    assert not [o for o in objects if o["kind"] == "Secret"], "mode secret must not make a certificate"
    rules = find(objects, "ClusterRole")["rules"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in rules
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = find(objects, kind)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "serving/flotilla-webhook"}
        for hook in config["webhooks"]:
            assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 5
            assert hook["clientConfig"]["service"]["port"] == 8443 and "caBundle" not in hook["clientConfig"]
    adapter = yaml.safe_load(find(objects, "ConfigMap", "llm-serving-prometheus-adapter")["data"]["config.yaml"])
    assert [r["name"]["as"] for r in adapter["rules"]] == ["vllm:num_requests_waiting"]
    assert "team-a, team-*" in notes and "failure policy Fail" in notes


@pytest.mark.parametrize(("namespaces", "example", "create"), [
    (["team-a", "team-b"], "team-a", False),  # its Role is there: it exists
    (["team-*", "team-x"], "team-x", True),
    (["team-*"], "NAMESPACE", True),
])
def test_notes_serve_the_example_in_a_watched_namespace(namespaces: list[str], example: str, create: bool) -> None:
    # Applied in a namespace the operator does not watch, the example InferenceService would never be reconciled.
    _, notes = render_chart({"operator": {"watchNamespaces": namespaces}})
    commands = [line.strip() for line in notes.splitlines() if line.strip().startswith("kubectl")]
    namespaced = [c for c in commands if " -n " in c and "rollout status" not in c]
    assert namespaced and all(f"-n {example} " in c + " " for c in namespaced), namespaced
    assert ("kubectl create namespace " + example in commands) == create
    assert not [c for c in commands if c.startswith("kubectl create namespace") and not c.endswith(example)]


def test_without_watched_namespaces_the_role_has_no_namespace_access() -> None:
    rules = find(render_chart()[0], "ClusterRole")["rules"]
    assert not [r for r in rules if "namespaces" in r["resources"]]


@pytest.mark.parametrize("namespaces", [[], ["team-a"]], ids=["cluster-wide", "team-a"])
@pytest.mark.parametrize("resource", ["pods", "replicasets"])
def test_pods_are_listable_only_while_the_serving_reader_runs(namespaces: list[str], resource: str) -> None:
    # The serving reader is the one user of pods/list (and of replicasets/list, to keep the pods the InferenceService's
    # own Deployment made); off (periodSeconds 0), no role may read every pod's spec (literal env values included) in
    # the watched namespaces, or cluster-wide, nor a ReplicaSet's pod template.
    def rules(period: int) -> list[dict[str, Any]]:
        objects = render_chart({"operator": {"watchNamespaces": namespaces, "serving": {"periodSeconds": period}}})[0]
        return [rule for o in objects if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]
                if resource in rule["resources"]]

    assert [rule["verbs"] for rule in rules(10)] == [["list"]] * len(rules(10)) and rules(10) and rules(0) == []


def test_rbac_has_no_wildcards() -> None:
    for values in VALUE_SETS.values():
        for rule in find(render_chart(values)[0], "ClusterRole")["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], rule
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule


def test_deployment_args_are_accepted_by_the_operator_cli() -> None:
    for values in VALUE_SETS.values():
        container = operator_container(render_chart(values)[0])
        assert container["command"] == ["flotilla", "operator"]
        args = operator_main.parse_args(container["args"])
        assert args.webhook_configuration == "", "the chart owns the webhook configurations"
        assert not args.no_webhook and args.engine_image
        allowed = values.get("operator", {}).get("hostPath", {}).get("allowedPrefixes", [])
        operator = values.get("operator", {})
        addresses = operator.get("keda", {}).get("prometheusAddresses")
        assert args.policy == AdmissionPolicy(host_path_prefixes=tuple(allowed),
                                              prometheus_addresses=tuple(addresses or [DEFAULT_PROMETHEUS_ADDRESS]),
                                              pod_annotations=tuple(operator.get("engineAnnotations", {}).get(
                                                  "allowed", [])),
                                              pod_labels=tuple(operator.get("engineLabels", {}).get("allowed", [])),
                                              priority_classes=tuple(operator.get("priorityClasses", {}).get(
                                                  "allowed", [])),
                                              service_accounts=tuple(operator.get("serviceAccounts", {}).get(
                                                  "allowed", [])),
                                              engine_image=args.engine_image)


def test_webhook_paths_are_the_operators_handler_ids() -> None:
    """Every webhook the chart configures is a kopf handler the operator serves, and vice versa."""
    registry = kopf.OperatorRegistry()
    webhook.register(registry, AdmissionPolicy(), [])
    operator_main.register_engine_image(registry, "x", [])
    served = {h.id for h in registry._webhooks.get_all_handlers()}
    objects, _ = render_chart()
    configured = {hook["clientConfig"]["service"]["path"].lstrip("/")
                  for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
                  for hook in find(objects, kind)["webhooks"]}
    assert configured == served
    kinds = {h.id: "Mutating" if h.reason.value == "mutating" else "Validating"
             for h in registry._webhooks.get_all_handlers()}
    for kind in ("Validating", "Mutating"):
        paths = {h["clientConfig"]["service"]["path"].lstrip("/")
                 for h in find(objects, f"{kind}WebhookConfiguration")["webhooks"]}
        assert paths == {i for i, k in kinds.items() if k == kind}


def test_chart_made_certificate_is_for_the_service_and_signed_by_the_ca_bundle(tmp_path: Path) -> None:
    objects, _ = render_chart()
    secret = find(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    bundles = {h["clientConfig"]["caBundle"] for kind in ("ValidatingWebhookConfiguration",
                                                           "MutatingWebhookConfiguration")
               for h in find(objects, kind)["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    verified = subprocess.run(["openssl", "verify", "-CAfile", tmp_path / "ca.crt", tmp_path / "tls.crt"],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", tmp_path / "tls.crt"],
                         capture_output=True, text=True, check=True).stdout
    service = find(objects, "Service")["metadata"]["name"]
    assert f"DNS:{service}.{NAMESPACE}.svc" in san and f"DNS:{service}.{NAMESPACE}.svc.cluster.local" in san
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["secretName"] == secret["metadata"]["name"]


@pytest.mark.parametrize(("values", "message"), [
    ({"webhook": {"failurePolicy": "Sometimes"}}, "webhook.failurePolicy must be Ignore or Fail"),
    ({"webhook": {"tls": {"mode": "acme"}}}, "webhook.tls.mode must be helm or secret"),
    ({"webhook": {"tls": {"mode": "secret"}}}, "webhook.tls.secretName is required"),
    ({"webhook": {"tls": {"mode": "secret", "secretName": "s"}}}, "needs webhook.tls.caBundle"),
    ({"operator": {"logLevel": "trace"}}, "operator.logLevel must be info, verbose or debug"),
    ({"webhook": {"timeoutSeconds": 60}}, "webhook.timeoutSeconds must be a whole number of seconds from 1 to 30"),
    ({"webhook": {"timeoutSeconds": 0}}, "webhook.timeoutSeconds must be a whole number of seconds from 1 to 30"),
    ({"webhook": {"timeoutSeconds": 2.5}}, "webhook.timeoutSeconds must be a whole number of seconds from 1 to 30"),
    ({"operator": {"podLabels": {"app.kubernetes.io/component": "llm"}}},
     'operator.podLabels: "app.kubernetes.io/component" is a label of the Deployment\'s selector'),
    # the chart's own: written twice, a winning user value would keep the operator on a renewed-away certificate
    ({"operator": {"podAnnotations": {"serving.flotilla.dev/webhook-certificate": "pinned"}}},
     'operator.podAnnotations: "serving.flotilla.dev/webhook-certificate" is set by the chart'),
    ({"operator": {"image": {"digest": "ab12"}}}, "operator.image.digest must be sha256:<64 hex digits>"),
    ({"engine": {"image": {"digest": "sha256:AB"}}}, "engine.image.digest must be sha256:<64 hex digits>"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
    ({"operator": {"watchNamespaces": ["!kube-system"]}}, "one namespace or glob per entry"),
    ({"operator": {"watchNamespaces": ["team-a,team-b"]}}, "one namespace or glob per entry"),
    # Service names are DNS-1035 labels: the apiserver refused these part-way through an install
    ({"fullnameOverride": "LLM-serving"}, 'the chart\'s object names start with "LLM-serving"'),
    ({"fullnameOverride": "llm.serving"}, 'the chart\'s object names start with "llm.serving"'),
    ({"fullnameOverride": "7llm"}, 'the chart\'s object names start with "7llm"'),
    ({"nameOverride": "Flotilla"}, f'the chart\'s object names start with "{RELEASE}-Flotilla"'),
    ({"nameOverride": "flo.tilla"}, f'the chart\'s object names start with "{RELEASE}-flo.tilla"'),
])
def test_bad_values_are_refused_with_a_message(values: dict[str, Any], message: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render_chart(values)


def _leaf_paths(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values and prefix.count(".") < 3 and not prefix.endswith(
            ("resources", "podSecurityContext", "securityContext")):
        return [p for k, v in values.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


@pytest.mark.parametrize(("values", "message"), [
    # A misspelt watchNamespaces would otherwise install a cluster-wide operator, silently.
    ({"operator": {"watchNamespace": ["team-a"]}},
     "at '/operator': additional properties 'watchNamespace' not allowed"),
    ({"serviceaccount": {"create": False}}, "at '': additional properties 'serviceaccount' not allowed"),
    ({"webhook": {"tls": {"secret": "cert"}}}, "at '/webhook/tls': additional properties 'secret' not allowed"),
    ({"rbac": {"create": "false"}}, "at '/rbac/create': got string, want boolean"),
    ({"operator": {"watchNamespaces": "team-a"}}, "at '/operator/watchNamespaces': got string, want array"),
])
def test_misspelt_or_mistyped_values_are_refused_by_the_schema(values: dict[str, Any], message: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render_chart(values)


def _schema_keys(schema: dict[str, Any], values: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(path, problem) wherever values.yaml's keys and the schema's properties of a closed object differ."""
    if "properties" not in schema or not isinstance(values, dict):
        return []
    properties = schema["properties"]
    problems = [(f"{prefix}.{k}", "not in the schema") for k in values if k not in properties]
    problems += [(f"{prefix}.{k}", "not in values.yaml") for k in properties if k not in values]
    return problems + [p for k in properties.keys() & values.keys()
                       for p in _schema_keys(properties[k], values[k], f"{prefix}.{k}")]


def test_values_schema_has_exactly_the_values_of_values_yaml() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # `global` is Helm's own: a parent chart passes it to every dependency; `enabled` is a parent's condition switch.
    assert _schema_keys(schema, values) == [(".global", "not in values.yaml"), (".enabled", "not in values.yaml")]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_chart_is_a_dependency_a_parent_switches_by_flotilla_enabled(tmp_path, enabled) -> None:
    """Helm's pattern for an optional dependency (`condition: flotilla.enabled` in the parent's Chart.yaml,
    `flotilla: {enabled: true}` in its values) hands `enabled` to Flotilla's values: the closed schema refused
    it ("at '': additional properties 'enabled' not allowed"), so no parent could include the chart that way."""
    import helm_python

    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "flotilla")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 0.1.0\ndependencies:\n"
        "  - name: flotilla\n    version: \">=0.0.0-0\"\n    condition: flotilla.enabled\n")
    (parent / "values.yaml").write_text("flotilla:\n  enabled: true\n")
    with helm_python.Chart.load(parent) as chart:
        rendered = chart.render({"flotilla": {"enabled": enabled}}, name="platform", namespace=NAMESPACE,
                                is_install=True)
    kinds = {doc["kind"] for path, text in rendered.items() if path.endswith(".yaml")
             for doc in yaml.safe_load_all(text) if doc}
    assert ("Deployment" in kinds) is enabled


def test_every_value_is_documented_in_values_yaml_and_docs() -> None:
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    marker = lines.index("# --- observability (dashboard, alert rules) ---")
    after = [line for line in lines[marker + 1:] if line.strip() and not line.startswith((" ", "#"))]
    assert after in ([], ["observability:"]), "the end of values.yaml is kept for the observability block"
    values = yaml.safe_load(text)
    # Each leaf key is preceded by a "# --" comment (helm-docs style).
    for path in _leaf_paths(values):
        key = path.rsplit(".", 1)[-1]
        index = next(i for i, line in enumerate(lines) if re.match(rf"\s*{re.escape(key)}:", line)
                     and _indent_path(lines, i) == path)
        above = index - 1
        while above >= 0 and lines[above].strip().startswith("#") and not lines[above].strip().startswith("# --"):
            above -= 1
        assert above >= 0 and lines[above].strip().startswith("# --"), f"{path} has no '# --' comment"
    table = (REPO / "docs" / "helm.md").read_text()
    for path in _leaf_paths(values):
        if path.startswith("observability."):
            continue  # the observability block is documented in docs/observability.md
        assert f"`{path}`" in table, f"docs/helm.md's values table lacks {path}"


def _indent_path(lines: list[str], index: int) -> str:
    """The dotted path of the key on line `index`, from the indentation of the keys above it."""
    path: list[str] = []
    indent = len(lines[index]) - len(lines[index].lstrip())
    path.append(lines[index].strip().split(":")[0])
    for line in reversed(lines[:index]):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        level = len(line) - len(line.lstrip())
        if level < indent:
            path.append(stripped.split(":")[0])
            indent = level
    return ".".join(reversed(path))


@pytest.mark.parametrize(("namespaces", "per_namespace"), [(["team-a", "team-b"], True), (["team-a", "team-*"], False)])
def test_watched_namespaces_get_roles_instead_of_cluster_wide_rights(namespaces: list[str],
                                                                    per_namespace: bool) -> None:
    objects, _ = render_chart({"operator": {"watchNamespaces": namespaces}})
    cluster = {r for rule in find(objects, "ClusterRole")["rules"] for r in rule["resources"]}
    default = {r for rule in find(render_chart()[0], "ClusterRole")["rules"] for r in rule["resources"]}
    namespaced = default - {"customresourcedefinitions"}
    roles = [o for o in objects if o["kind"] == "Role"]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    if per_namespace:
        assert cluster == {"customresourcedefinitions", "namespaces"}
        assert [r["metadata"]["namespace"] for r in roles] == namespaces
        for role in roles:
            assert {r for rule in role["rules"] for r in rule["resources"]} == namespaced
            assert role["rules"] == [rule for rule in find(render_chart()[0], "ClusterRole")["rules"]
                                     if rule["resources"] != ["customresourcedefinitions"]]
        assert [(b["metadata"]["namespace"], b["roleRef"]["kind"], b["subjects"][0]["name"]) for b in bindings] == \
            [(ns, "Role", find(objects, "ServiceAccount")["metadata"]["name"]) for ns in namespaces]
    else:
        assert namespaced <= cluster and not roles and not bindings


@pytest.mark.parametrize(("namespaces", "selected"), [(["team-a", "team-b"], True), (["team-a", "team-*"], False),
                                                      ([], False)])
def test_webhooks_select_the_watched_namespaces_where_they_can(namespaces: list[str], selected: bool) -> None:
    # Another release's namespaces are not sent to this release's webhooks (nor blocked by its outage under
    # failurePolicy Fail); a glob cannot be a label selector, and then the operator itself leaves them alone.
    objects, _ = render_chart({"operator": {"watchNamespaces": namespaces}})
    hooks = [hook for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
             for hook in find(objects, kind)["webhooks"]]
    expected = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}
    assert [hook.get("namespaceSelector") for hook in hooks] == [expected if selected else None] * len(hooks)


def test_a_release_name_that_makes_no_service_name_is_refused_with_a_message() -> None:
    """Helm takes release names with dots (and a leading digit); the chart's Service name made from one would not do."""
    import helm_python

    with pytest.raises(helm_python.HelmError, match=re.escape('object names start with "my.release-flotilla"')):
        render_chart(name="my.release")
    objects, _ = render_chart({"fullnameOverride": "my-release"}, name="my.release")  # the way out
    assert find(objects, "Service")["metadata"]["name"] == "my-release-operator-webhook"


@pytest.mark.parametrize(("kind", "key"), [("ConfigMap", "dashboard"), ("PrometheusRule", "prometheusRule")])
def test_observability_labels_that_repeat_a_chart_label_override_it_written_once(kind: str, key: str) -> None:
    """A user label with a chart label's key wins and is written once (written twice, the YAML reader chose)."""
    import helm_python

    labels = {"app.kubernetes.io/part-of": "ml-platform", "release": "kube-prometheus-stack"}
    values = {"observability": {key: {"enabled": True, "labels": labels}}}
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="flotilla", namespace=NAMESPACE, is_install=True)
    [text] = [t for t in rendered.values() if f"kind: {kind}\n" in t and "component: observability" in t]
    assert text.count("app.kubernetes.io/part-of:") == 1
    made = find(render_chart(values)[0], kind, {"ConfigMap": "flotilla-dashboard", "PrometheusRule": "flotilla-engine"}[
        kind])["metadata"]["labels"]
    assert made["app.kubernetes.io/part-of"] == "ml-platform" and made["release"] == "kube-prometheus-stack"
    assert made["app.kubernetes.io/component"] == "observability" and made["app.kubernetes.io/managed-by"] == "Helm"


def test_large_and_small_numbers_reach_the_operator_flags_as_numbers() -> None:
    """Helm reads a values file's numbers as floats, which a template prints as 1e+06 from a million on: the int flag
    --serving-concurrency then refused it and the operator could not start."""
    serving = {"concurrency": 1000000, "periodSeconds": 12345678, "windowSeconds": 2000000, "timeoutSeconds": 0.00001}
    container = operator_container(render_chart({"operator": {"resyncSeconds": 1000000, "serving": serving}})[0])
    assert {"--serving-concurrency=1000000", "--resync-seconds=1000000", "--serving-period=12345678",
            "--serving-window=2000000", "--serving-timeout=0.00001"} <= set(container["args"])
    args = operator_main.parse_args(container["args"])
    assert (args.serving_concurrency, args.resync_seconds, args.serving_timeout) == (1000000, 1e6, 1e-5)


def test_a_user_webhook_certificate_annotation_is_written_once_without_a_chart_made_certificate() -> None:
    """With webhook.tls.mode secret the chart writes no certificate annotation, so a user's is the only one."""
    import helm_python

    key = "serving.flotilla.dev/webhook-certificate"
    values = {"operator": {"podAnnotations": {key: "2027-01-01", "example.com/owner": "ml"}},
              "webhook": {"tls": {"mode": "secret", "secretName": "s", "caBundle": "Y2E="}}}
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    [text] = [t for path, t in rendered.items() if path.endswith("/deployment.yaml")]
    assert text.count(key + ":") == 1
    annotations = find(render_chart(values)[0], "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {key: "2027-01-01", "example.com/owner": "ml"}

"""The admin's admission policy: hostPath model sources are off unless allowed, then limited to prefixes."""

from __future__ import annotations

import pytest

from flotilla.operator.admission import review
from flotilla.operator.main import parse_args
from flotilla.operator.policy import AdmissionPolicy

ALLOWED = AdmissionPolicy(host_path_prefixes=("/models", "/mnt/ckpt"))


def source(path: str) -> dict:
    return {"model": {"source": f"hostPath://{path}"}}


@pytest.mark.parametrize("path", ["/", "/etc", "/proc", "/var/run/docker.sock", "/models/llama"])
def test_host_path_is_refused_by_default_whatever_the_path(path):
    errors = review(source(path), "x").errors
    assert errors == ["spec.model.source: hostPath model sources are turned off on this cluster; use pvc:// or "
                      "hf://, or ask the cluster admin to allow a directory (operator flag --host-path-prefix, "
                      "chart value operator.hostPath.allowedPrefixes)"]


@pytest.mark.parametrize("path", ["/models", "/models/llama-3", "/mnt/ckpt/a/b"])
def test_paths_under_an_allowed_prefix_are_admitted(path):
    assert review(source(path), "x", ALLOWED).errors == []


@pytest.mark.parametrize(("path", "problem"), [
    ("/etc", "/etc is outside the host directories this cluster allows (/models, /mnt/ckpt)"),
    ("/modelsx", "/modelsx is outside the host directories this cluster allows (/models, /mnt/ckpt)"),
    ("/models/../etc", "/models/../etc has a '.' or '..' segment"),
    ("/models/..", "/models/.. has a '.' or '..' segment"),
    ("/models/./x", "/models/./x has a '.' or '..' segment"),
    ("/models//x", "/models//x is not in normal form (no repeated or trailing slashes)"),
    ("/models/x/", "/models/x/ is not in normal form (no repeated or trailing slashes)"),
    ("//models", "//models is not in normal form (no repeated or trailing slashes)"),
])
def test_escapes_from_an_allowed_prefix_are_refused(path, problem):
    assert review(source(path), "x", ALLOWED).errors == [f"spec.model.source: {problem}"]


def test_lora_adapter_sources_follow_the_same_policy():
    spec = {"model": {"source": "pvc://m"}, "lora": {"adapters": [{"name": "a", "source": "hostPath:///etc"}]}}
    assert "spec.lora.adapters[0].source: hostPath model sources are turned off" in review(spec, "x").message


@pytest.mark.parametrize("prefix", ["models", "/models/../etc", "/models/"])
def test_the_operator_refuses_a_bad_prefix_at_start_up(prefix, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--host-path-prefix", prefix])
    assert "host path prefix" in capsys.readouterr().err


def test_the_operator_flag_sets_the_policy():
    assert parse_args(["--host-path-prefix", "/models", "--host-path-prefix", "/mnt/ckpt"]).policy == ALLOWED
    assert parse_args([]).policy == AdmissionPolicy()


def test_keda_may_query_only_the_prometheus_the_admin_lists():
    policy = parse_args(["--prometheus-address", "http://prometheus.obs.svc:9090",
                         "--prometheus-address", "https://thanos.obs.svc/query"]).policy
    spec = {"model": {"source": "pvc://m"}, "autoscaling": {"maxReplicas": 2}}
    # The schema's default stands for the admin's first address, which the ScaledObject then gets.
    left_out = review(spec, "x", policy)
    assert left_out.errors == [] and left_out.spec.autoscaling.prometheus_address == "http://prometheus.obs.svc:9090"
    spec["autoscaling"]["prometheusAddress"] = "https://thanos.obs.svc/query"
    assert review(spec, "x", policy).spec.autoscaling.prometheus_address == "https://thanos.obs.svc/query"
    spec["autoscaling"]["prometheusAddress"] = "http://10.0.0.1:9090"
    assert review(spec, "x", policy).errors == [
        "spec.autoscaling.prometheusAddress: http://10.0.0.1:9090 is not a Prometheus this cluster allows "
        "(http://prometheus.obs.svc:9090, https://thanos.obs.svc/query); leave the field out for the cluster's own"]


@pytest.mark.parametrize("address", ["file:///etc/passwd", "http://u:p@h:9090", "http://h/?q=1"])
def test_the_operator_refuses_a_bad_prometheus_address_at_start_up(address, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--prometheus-address", address])
    assert "Prometheus address" in capsys.readouterr().err


@pytest.mark.parametrize(("key", "allowed"), [
    ("team", True), ("owner-id_2", True),  # the user's own keys
    ("sidecar.istio.io/userVolume", False), ("io.kubernetes.cri-o.Devices", False), ("iam.amazonaws.com/role", False),
    ("prometheus.io/scrape", True), ("prometheus.io.scrape", False),  # under the admin's prefix, and not
    ("sidecar.istio.io/inject", True), ("sidecar.istio.io/injectX", False),  # the admin's exact key, and not
    ("container.apparmor.security.beta.kubernetes.io/engine", False),  # never, whatever is listed
])
def test_pod_annotations_are_the_users_own_keys_or_the_admins_list(key, allowed):
    policy = parse_args(["--pod-annotation", "prometheus.io/", "--pod-annotation", "sidecar.istio.io/inject",
                         "--pod-annotation", "container.apparmor.security.beta.kubernetes.io/"]).policy
    errors = review({"model": {"source": "pvc://m"}, "pod": {"annotations": {key: "x"}}}, "x", policy).errors
    assert (errors == []) == allowed, errors


@pytest.mark.parametrize(("key", "allowed"), [
    ("team", True), ("team.name", True),  # the user's own keys (a dot is part of a plain label name)
    ("azure.workload.identity/use", False), ("sidecar.istio.io/inject", False),
    ("example.com/owner", True), ("example.com.evil/owner", False),  # under the admin's prefix, and not
    ("security.istio.io/tlsMode", True), ("security.istio.io/tlsModeX", False),  # the admin's exact key, and not
    ("app.kubernetes.io/name", False),  # the operator's, whatever is listed
])
def test_pod_labels_are_the_users_plain_keys_or_the_admins_list(key, allowed):
    policy = parse_args(["--pod-label", "example.com/", "--pod-label", "security.istio.io/tlsMode",
                         "--pod-label", "app.kubernetes.io/"]).policy
    errors = review({"model": {"source": "pvc://m"}, "pod": {"labels": {key: "x"}}}, "x", policy).errors
    assert (errors == []) == allowed, errors


@pytest.mark.parametrize(("flags", "name", "allowed"), [
    ([], "inference", True), ([], "system-node-critical", False), ([], "system-cluster-critical", False),
    (["--priority-class", "inference"], "inference", True), (["--priority-class", "inference"], "batch", False),
    (["--priority-class", "system-cluster-critical"], "system-cluster-critical", True),
])
def test_priority_classes_are_any_but_the_system_ones_or_the_admins_list(flags, name, allowed):
    spec = {"model": {"source": "pvc://m"}, "pod": {"priorityClassName": name}}
    errors = review(spec, "x", parse_args(flags).policy).errors
    assert (errors == []) == allowed, errors


@pytest.mark.parametrize(("flags", "name", "allowed"), [
    ([], "cloud-admin", True), ([], None, True),  # by default any account of the namespace, as for a Pod
    (["--service-account", "model-reader"], "model-reader", True),
    (["--service-account", "model-reader"], "cloud-admin", False),
    (["--service-account", "model-reader"], "default", False),  # named, the default account is an account like any
    (["--service-account", "model-reader"], None, True),  # left out: the namespace's default account, always
])
def test_service_accounts_are_any_or_the_admins_list(flags, name, allowed):
    spec = {"model": {"source": "pvc://m"}, "pod": {} if name is None else {"serviceAccountName": name}}
    errors = review(spec, "x", parse_args(flags).policy).errors
    assert (errors == []) == allowed, errors
    if not allowed:
        assert errors == [f"spec.pod.serviceAccountName: {name} is not a ServiceAccount this cluster allows "
                          "InferenceServices (model-reader): a cloud's workload identity gives the pods the account's "
                          "role; leave the field out for the namespace's default, or ask the cluster admin to allow "
                          "it (operator flag --service-account, chart value operator.serviceAccounts.allowed)"]


@pytest.mark.parametrize("pattern", ["!kube-system", "team-a,team-b", "team-*, !team-x"])
def test_the_operator_refuses_kopfs_negated_or_listed_namespace_patterns(pattern, capsys):
    # kopf reads "!x" as "every namespace but x" and "a,b" as two patterns; the resync, the serving reader and the
    # webhooks read --namespace as one glob, so they listed /namespaces/!x/... and skipped every request.
    with pytest.raises(SystemExit):
        parse_args(["-n", pattern])
    assert "--namespace" in capsys.readouterr().err
    assert parse_args(["-n", "team-[!x]*"]).namespaces == ["team-[!x]*"]  # a glob's own negated class is fine

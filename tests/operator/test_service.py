"""The Service in front of the engine pods."""

from __future__ import annotations

from flotilla.operator.names import INFERENCESERVICE_LABEL, service_url
from flotilla.operator.service import build_service


def test_service_exposes_port_8000_named_http_to_this_inferenceservices_pods(validate_manifest):
    svc = build_service("llama", "serving")
    validate_manifest(svc)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == {INFERENCESERVICE_LABEL: "llama"}
    assert svc["metadata"]["labels"][INFERENCESERVICE_LABEL] == "llama"  # copied to series by the ServiceMonitor


def test_url_is_the_in_cluster_service_address():
    assert service_url("llama", "serving") == "http://llama.serving.svc.cluster.local:8000"

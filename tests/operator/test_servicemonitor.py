"""The ServiceMonitor that lets Prometheus scrape the engine's /metrics."""

from __future__ import annotations

from flotilla.operator.names import INFERENCESERVICE_LABEL
from flotilla.operator.service import build_service
from flotilla.operator.servicemonitor import build_service_monitor
from flotilla.operator.spec import InferenceServiceSpec


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, **spec})


def test_scrapes_metrics_on_the_http_port_of_this_inferenceservices_service():
    sm = build_service_monitor(make(), "llama", "serving")
    svc = build_service("llama", "serving")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor"
    # The selector must match the Service's labels, and the endpoint port its port name.
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s", "scheme": "http",
                                        "followRedirects": False}]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}


def test_every_series_carries_the_inferenceservice_label():
    assert build_service_monitor(make(), "llama", "serving")["spec"]["targetLabels"] == [INFERENCESERVICE_LABEL]


def test_interval_and_extra_labels_come_from_the_spec():
    sm = build_service_monitor(make(monitoring={"interval": "5s", "labels": {"release": "prom"}}), "llama", "ns")
    assert sm["spec"]["endpoints"][0]["interval"] == "5s"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["metadata"]["labels"][INFERENCESERVICE_LABEL] == "llama"


def test_no_service_monitor_when_turned_off():
    assert build_service_monitor(make(monitoring={"serviceMonitor": False}), "llama", "ns") is None

"""Fixtures for the Helm chart's tests: rendering with helm-python-sdk, and a control plane of this
directory's own (shared fixtures from tests/k8s_fixtures.py), so the chart's operator never meets
the one tests/operator keeps running."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from .. import k8s_fixtures
from ..k8s_fixtures import REPO

CHART = REPO / "charts" / "flotilla"
RELEASE, NAMESPACE = "flotilla", "flotilla"

validate_manifest = k8s_fixtures.validate_manifest
pytest_configure = k8s_fixtures.pytest_configure


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k8s_fixtures.ControlPlane]:
    """A control plane for one test module, stopped when the module is done (not at the session's end)."""
    yield from k8s_fixtures.run_control_plane(tmp_path_factory)


def render_chart(values: dict[str, Any] | None = None, name: str = RELEASE,
                 namespace: str = NAMESPACE) -> tuple[list[dict[str, Any]], str]:
    """(the rendered objects, NOTES.txt) for `values`, as `helm template` would make them."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    objects = [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
               for doc in yaml.safe_load_all(text) if doc]
    notes = next((text for path, text in rendered.items() if path.endswith("NOTES.txt")), "")
    return objects, notes


@pytest.fixture(scope="session")
def render() -> Callable[..., tuple[list[dict[str, Any]], str]]:
    return render_chart


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (and `name`) among `objects`."""
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]

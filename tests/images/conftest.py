"""The images, built once per test run by scripts/build-images.sh (buildah, chroot isolation, FROM the
local debootstrap base), and containers of them run with `buildah run`.

The build starts in the background as soon as collection ends (when a selected test needs `images`), so that it
overlaps the tests that run first; the `images` fixture waits for it. A rebuild is skipped when the inputs are
unchanged (the script labels each image with their hash), so a second run only exports nothing and starts containers.
Building needs root (buildah and debootstrap; the script apt-installs them when missing); without it the tests are
skipped, unless FLOTILLA_K8S_REQUIRED or FLOTILLA_IMAGES_REQUIRED is set (as in CI), when they fail instead.
Under chroot isolation `buildah run` shares the host's network namespace: a server inside binds
127.0.0.1 and the test reaches it there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
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


def _can_build() -> bool:
    """Root, or buildah and debootstrap already installed (the script apt-installs them as root)."""
    return os.geteuid() == 0 or bool(shutil.which("buildah") and shutil.which("debootstrap"))


@dataclass
class _Build:
    """build-images.sh running in the background: its output goes to files, read when it ends."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float

    @classmethod
    def start(cls) -> _Build:
        logs = Path(tempfile.mkdtemp(prefix="flotilla-images-build-"))
        stdout, stderr = logs / "stdout", logs / "stderr"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(["bash", str(SCRIPT)], env={**os.environ, "OUT_DIR": str(CACHE / "oci")},
                                       stdout=out, stderr=err, start_new_session=True)
        return cls(process, stdout, stderr, time.monotonic())

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """Exit status, stdout and stderr; the script is ended if it outlasts `timeout` seconds."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return self.process.returncode, self.stdout.read_text(errors="replace"), self.stderr.read_text(errors="replace")

    def stop(self) -> None:
        """End the script and whatever it started (its own process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# The build started when collection ends (`pytest_collection_finish`), so that its ~3.5 min (mostly one core: pip,
# the layer copies, gzip) overlap the tests that run before this directory's; `images` waits for it.
_early: list[_Build] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the image build now when a selected test needs the `images` fixture and the build can run here."""
    if session.config.option.collectonly or not _can_build():
        return
    if any("images" in getattr(item, "fixturenames", ()) for item in session.items):
        _early.append(_Build.start())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build that no test waited for (a run ended early) is not left running."""
    for build in _early:
        build.stop()


@pytest.fixture(scope="session")
def images() -> Images:
    """Both images built (or found up to date) and exported as OCI archives: the build started at the end of
    collection, else one started now."""
    required = os.environ.get("FLOTILLA_K8S_REQUIRED") or os.environ.get("FLOTILLA_IMAGES_REQUIRED")
    if not _can_build():
        reason = "building images needs root (buildah, debootstrap)"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    build = _early[0] if _early else _Build.start()
    returncode, stdout, stderr = build.wait(1800 - (time.monotonic() - build.started))
    seconds = time.monotonic() - build.started
    assert returncode == 0, f"build-images.sh failed:\n{stdout[-4000:]}\n{stderr[-6000:]}"
    out_dir = CACHE / "oci"
    archives = {"engine": out_dir / f"flotilla-engine-{VERSION}-cpu.oci.tar",
                "operator": out_dir / f"flotilla-operator-{VERSION}.oci.tar"}
    return Images(ENGINE, OPERATOR, archives, stderr, seconds)


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

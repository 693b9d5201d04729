"""SIGTERM or SIGINT while `flotilla serve` starts (engine/server/start_signals.py): the engine-core process that is
being spawned or is building its engine is stopped with the server, which exits 0 (as a SIGTERM drain does) with no
traceback in its log. Before, the server died of the signal (-15) and the core it left behind printed an
UnpicklingError (its spawn data cut short) or BrokenPipeError tracebacks (its "ready" to a dead parent) after
going on to build its engine alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from .conftest import free_port


def _start(model: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "flotilla.engine.server", str(model), "--port", str(free_port()), "--host",
           "127.0.0.1", "--max-model-len", "128", "--disable-log-stats",
           "--structured-outputs-config", '{"warm_up": false}']
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.02)


def _core(server: subprocess.Popen[bytes]) -> psutil.Process | None:
    """The spawned engine-core process (not multiprocessing's resource tracker), once it exists."""
    for child in psutil.Process(server.pid).children():
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in cmdline:
            return child
    return None


@pytest.mark.parametrize(("sig", "when"), [
    (signal.SIGTERM, "spawned"),  # the core still reading its spawn data or importing torch
    (signal.SIGINT, "spawned"),
    (signal.SIGTERM, "model loaded"),  # the core building its engine, or ready: the server not yet serving
])
def test_a_signal_while_starting_stops_the_core_and_exits_cleanly(tiny_model_dirs, tmp_path, sig, when):
    log = tmp_path / "server.log"
    server = _start(tiny_model_dirs["llama"], log)
    try:
        _wait_for(lambda: _core(server) is not None or server.poll() is not None, "an engine-core process")
        core = _core(server)
        assert core is not None, log.read_text()
        if when == "model loaded":
            _wait_for(lambda: "model loaded" in log.read_text() or server.poll() is not None, "the model loaded")
        server.send_signal(sig)
        assert server.wait(timeout=120) == 0, log.read_text()
        _wait_for(lambda: not core.is_running() or core.status() == psutil.STATUS_ZOMBIE, "the core's end", 30)
        time.sleep(1)  # what the core would print, had it been left behind, lands in the same log
        text = log.read_text()
        assert "Traceback" not in text and "Error" not in text, text
        # "model loaded" is the core's line: the server may have gone on to serve (and drain) by the signal
        assert f"{sig.name} while starting" in text or (when == "model loaded" and "draining" in text), text
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

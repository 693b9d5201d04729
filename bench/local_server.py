"""A server the CPU benchmarks start on this machine: a free loopback port, and the wait until it serves."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    """A loopback port free now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(process: subprocess.Popen, url: str, timeout_s: float = 600) -> None:
    """Return once `url`'s /health answers 200; kill the server and raise if it exits first or `timeout_s` passes
    (model loading and warm-up take minutes at load)."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server did not start (exit code {process.poll()})")

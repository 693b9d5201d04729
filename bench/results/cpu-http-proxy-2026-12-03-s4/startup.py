"""Start-up and stop of `flotilla serve` with the engine on a thread (VLLM_ENABLE_V1_MULTIPROCESSING=0) and in
its own process (1), alternating: seconds from Popen to /health 200, CPU-seconds (user + system) of the server's
process tree at that moment, and seconds from SIGTERM to exit.

    python bench/results/cpu-http-proxy-2026-12-03-s4/startup.py MODEL_DIR ROUNDS

MODEL_DIR: e.g. `python bench/model_dirs.py tiny-llama /tmp/tiny` (served with --load-format dummy).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def tree_cpu(pid: int) -> float:
    """User + system CPU-seconds of `pid` and its live descendants (Linux /proc)."""
    total, stack = 0.0, [pid]
    while stack:
        proc = stack.pop()
        try:
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{proc}/task"):
                stack += [int(c) for c in Path(f"/proc/{proc}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(model: str, mode: str) -> dict[str, float | str]:
    """Start a server with the switch at `mode`, wait for /health, stop it; the figures."""
    port = free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": mode, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flotilla.engine.server", model, "--port", str(port), "--host", "127.0.0.1",
           "--max-model-len", "256", "--block-size", "8", "--load-format", "dummy", "--disable-log-stats",
           "--uvicorn-log-level", "warning"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd="/tmp")
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    up = time.monotonic() - t0
    cpu = tree_cpu(proc.pid)
    t1 = time.monotonic()
    proc.terminate()
    proc.wait(120)
    down = time.monotonic() - t1
    load = Path("/proc/loadavg").read_text().split()[0]
    return {"up_s": round(up, 2), "cpu_s": round(cpu, 2), "stop_s": round(down, 2), "load": load}


def main() -> None:
    """Alternate the two modes ROUNDS times; print each start and the whole as JSON."""
    model, rounds = sys.argv[1], int(sys.argv[2])
    results: dict[str, list[dict[str, float | str]]] = {"0": [], "1": []}
    for _ in range(rounds):
        for mode in ("0", "1"):
            results[mode].append(one_start(model, mode))
            print(mode, results[mode][-1], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""What uvicorn's access log (on by default, as vLLM's) costs the API process per request, on the CPU.

Starts two servers on the tests' tiny Llama, both at --uvicorn-log-level info with stdout to a file: one as started
by default (an access line per request), one with --disable-uvicorn-access-log. In `--rounds` alternating rounds it
sends each `--requests` GET /v1/models (the cheapest route: the line's share is largest) and as many streamed
completions of `--tokens` tokens, one after another, and reads the API process's CPU time (user + system; its engine
core is another process) before and after. It prints the CPU microseconds per request of each server and kind, and
the difference: a cost per request shows as the same difference for both kinds, a cost per token as a larger one
for the streams.

    OMP_NUM_THREADS=1 .venv/bin/python bench/access_log_cost.py [--rounds 3] [--requests 300] [--tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
from gil_stall import tiny_llama
from local_server import free_port, wait_until_serving


def start(model: Path, log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """A server on `model` writing stdout and stderr to `log`, and its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flotilla.engine.server", str(model), "--port", str(port),
                                "--max-model-len", "512", "--served-model-name", "tiny", "--disable-log-stats",
                                "--uvicorn-log-level", "info", *flags],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, url)
    return process, url


def cpu_us_per_request(process: subprocess.Popen, url: str, kind: str, requests: int, tokens: int) -> float:
    """The API process's CPU microseconds per request over `requests` of `kind` ("models" or "stream")."""
    api = psutil.Process(process.pid)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=600) as client:
        before = api.cpu_times()
        for _ in range(requests):
            if kind == "models":
                client.get(f"{url}/v1/models").raise_for_status()
            else:
                with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
                    reply.raise_for_status()
                    for _ in reply.iter_bytes():
                        pass
        after = api.cpu_times()
    return (after.user + after.system - before.user - before.system) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = tiny_llama(root)
        servers = {"access log on": start(model, root / "on.log"),
                   "access log off": start(model, root / "off.log", "--disable-uvicorn-access-log")}
        try:
            samples: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for kind in ("models", "stream"):
                    for name, (process, url) in servers.items():
                        us = cpu_us_per_request(process, url, kind, args.requests, args.tokens)
                        samples.setdefault((name, kind), []).append(us)
            lines = {name: (root / f"{name.split()[-1]}.log").read_text().count(" HTTP/1.1\" ") for name in servers}
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait()
    for kind in ("models", "stream"):
        on, off = (statistics.median(samples[name, kind]) for name in servers)
        print(f"{kind:7s} on {on:8.0f} us  off {off:8.0f} us  on-off {on - off:6.0f} us/request "
              f"(medians of {args.rounds} rounds of {args.requests})")
    print(f"access lines written: {lines}")


if __name__ == "__main__":
    main()

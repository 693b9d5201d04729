"""How long a whole-vocabulary logprobs reply takes through the server (CPU, embedded model): `/v1/completions`,
one token, `logprobs` = the vocabulary (49,152 alternatives a token), non-streamed and streamed with `n` 1 and 4;
wall seconds from the request to the reply's last byte, each case `--repeat` times (the median is reported).

The server's own cost is the figure: the engine's part (one token of a 135M model) is milliseconds, the rest is
building and encoding ~1.5 MB of JSON a choice, on worker threads with GIL hand-overs (engine/server/json_reply.py).

    .venv/bin/python bench/whole_vocab_reply.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import httpx
from local_server import free_port, wait_until_serving

from flotilla.engine.embedded_model import embedded_model_dir

VOCAB = 49152  # the embedded model's
CASES = [(1, False), (1, True), (4, True)]  # (n, stream)


def _time_case(url: str, n: int, stream: bool) -> tuple[float, int]:
    """Wall seconds and reply bytes of one request."""
    body = {"model": "m", "prompt": "hello", "max_tokens": 1, "n": n, "logprobs": VOCAB, "stream": stream}
    start = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - start, len(reply.content)


def main() -> None:
    """Start the server, time each case, print one line a case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}
    server = subprocess.Popen([sys.executable, "-m", "flotilla.engine.server", str(embedded_model_dir()), "--port",
                               str(port), "--served-model-name", "m", "--max-model-len", "512", "--max-logprobs",
                               "-1", "--disable-log-stats", "--uvicorn-log-level", "warning"], env=env)
    try:
        wait_until_serving(server, url)
        _time_case(url, 1, False)  # the per-token label cache filled, as on a server that has answered before
        for n, stream in CASES:
            runs = [_time_case(url, n, stream) for _ in range(args.repeat)]
            print(f"n={n} stream={stream}: median {statistics.median(t for t, _ in runs):.2f} s "
                  f"(runs {', '.join(f'{t:.2f}' for t, _ in runs)}), {runs[0][1]:,} bytes", flush=True)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()

"""How long one large non-streamed reply holds the server's event loop (CPU, embedded model).

A legal request can ask for a reply of over a million values: `n` choices, each echoing a long prompt with its
logprobs (and `prompt_logprobs`). Building those choices and encoding the JSON body are the front end's work;
while they ran on the event loop, /health and every other request waited for them. This starts a server, asks
/health over and over while one such request is answered, and prints the request's time, its body's size and
the longest /health wait (the stall a liveness probe sees), for each endpoint; first the reply alone, unprobed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/reply_stall.py [--n 128] [--words 500] [--logprobs 20]

The Responses API has no `n`: its largest reply is one output's logprobs, `--responses-tokens` tokens of
`--logprobs` alternatives each (-1, the whole vocabulary, with `--max-logprobs -1`):

    OMP_NUM_THREADS=1 .venv/bin/python bench/reply_stall.py --cases responses --max-logprobs -1 --logprobs -1
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import httpx

from flotilla.engine.embedded_model import embedded_model_dir


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(max_model_len: int, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flotilla.engine.server", str(embedded_model_dir()),
                                "--port", str(port), "--max-model-len", str(max_model_len), "--served-model-name",
                                "m", "--disable-log-stats", "--uvicorn-log-level", "warning", *flags])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not start")


def measure(url: str, path: str, body: dict, probe_every: float) -> tuple[float, int, float, int]:
    """(the request's seconds, its body's bytes, the longest /health wait meanwhile, /health answers meanwhile);
    `probe_every` 0: no /health asked (the wait reads 0)."""
    waits: list[float] = [0.0]
    done = threading.Event()

    def ticker() -> None:
        with httpx.Client(timeout=600) as client:
            while probe_every and not done.is_set():
                asked = time.monotonic()
                client.get(f"{url}/health")
                waits.append(time.monotonic() - asked)
                time.sleep(probe_every)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    response = httpx.post(f"{url}{path}", json=body, timeout=600)
    took = time.monotonic() - started
    done.set()
    thread.join()
    response.raise_for_status()
    return took, len(response.content), max(waits), len(waits) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--words", type=int, default=500, help="the prompt: this many times 'hello '")
    parser.add_argument("--logprobs", type=int, default=20)
    parser.add_argument("--probe-every", type=float, default=0.02, help="seconds between two /health asks")
    parser.add_argument("--cases", default="completions,chat")
    parser.add_argument("--chat-tokens", type=int, default=32, help="each chat choice's tokens (with their logprobs)")
    parser.add_argument("--responses-tokens", type=int, default=32, help="the Responses output's tokens")
    parser.add_argument("--max-logprobs", type=int, default=None, help="the server's --max-logprobs")
    parser.add_argument("--no-store", action="store_true", help="the Responses request's store: false")
    args = parser.parse_args()
    flags = ["--max-logprobs", str(args.max_logprobs)] if args.max_logprobs is not None else []
    process, url = start(2 * args.words + max(64, args.responses_tokens + 16), *flags)
    prompt = "hello " * args.words
    k = args.logprobs
    cases = {
        "completions": ("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 1, "n": args.n,
                                            "echo": True, "logprobs": k, "prompt_logprobs": k}),
        "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": prompt}],
                                          "max_tokens": args.chat_tokens, "ignore_eos": True, "n": args.n,
                                          "logprobs": True, "top_logprobs": k}),
        "responses": ("/v1/responses", {"model": "m", "input": prompt, "max_output_tokens": args.responses_tokens,
                                        "ignore_eos": True, "include": ["message.output_text.logprobs"],
                                        "top_logprobs": k, "store": not args.no_store}),
    }
    try:
        for name in args.cases.split(","):
            path, body = cases[name]
            alone = measure(url, path, body, 0)[0]
            took, size, stall, answers = measure(url, path, body, args.probe_every)
            print(f"{name:12s} reply {alone:6.2f} s alone, {took:6.2f} s probed  body {size / 1e6:7.1f} MB  "
                  f"longest /health wait {stall:6.3f} s ({answers} answers)", flush=True)
    finally:
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    main()

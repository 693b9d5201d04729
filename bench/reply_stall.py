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

Streamed (`responses-stream`, `chat-stream`), each step's events carry that step's logprobs, and a Responses stream's
closing events (`response.output_text.done`, `response.output_item.done`, `response.completed`) each carry the
whole output's; the longest /health wait is printed for the whole stream and for its end alone (from the last
event before the closing ones until the stream ends):

    OMP_NUM_THREADS=1 .venv/bin/python bench/reply_stall.py --cases responses-stream --max-logprobs -1 --logprobs -1
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import httpx
from local_server import free_port, wait_until_serving

from flotilla.engine.embedded_model import embedded_model_dir


def start(max_model_len: int, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flotilla.engine.server", str(embedded_model_dir()),
                                "--port", str(port), "--max-model-len", str(max_model_len), "--served-model-name",
                                "m", "--disable-log-stats", "--uvicorn-log-level", "warning", *flags])
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, url)
    return process, url


# A stream's end: its first closing event (each of a Responses stream's carries the whole output's logprobs)
END_MARKS = ("event: response.output_text.done", "data: [DONE]")


def posted(url: str, path: str, body: dict) -> tuple[int, float | None]:
    """POST `body` (read to its end): its bytes, and for a stream when its end began (the arrival of the piece of
    the stream before the one that holds the first closing event, `END_MARKS`; the events are hundreds of MB, so each
    piece is only searched, never kept)."""
    if not body.get("stream"):
        response = httpx.post(f"{url}{path}", json=body, timeout=600)
        response.raise_for_status()
        return len(response.content), None
    size, end_began, before, tail = 0, None, None, ""
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=600) as response:
        response.raise_for_status()
        for text in response.iter_text():
            size += len(text.encode())
            if end_began is None and any(mark in tail + text for mark in END_MARKS):
                end_began = before
            tail, before = text[-40:], time.monotonic()
    return size, end_began


def peak_rss(pid: int, reset: bool = False) -> int:
    """The server's peak resident set (VmHWM) in bytes since it was last reset; `reset`: start a new peak (Linux's
    clear_refs 5) and return the resident set now (VmRSS), where it starts."""
    if reset:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:" if reset else "VmHWM:"))
    return int(line.split()[1]) * 1024


def measure(url: str, path: str, body: dict, probe_every: float) -> tuple[float, int, float, float, int]:
    """(the request's seconds, its body's bytes, the longest /health wait meanwhile, the longest one that overlapped a
    stream's end (`posted`), /health answers meanwhile); `probe_every` 0: no /health asked (the waits read 0)."""
    probes: list[tuple[float, float]] = []  # (asked, answered)
    done = threading.Event()

    def ticker() -> None:
        with httpx.Client(timeout=600) as client:
            while probe_every and not done.is_set():
                asked = time.monotonic()
                while True:
                    try:
                        client.get(f"{url}/health")
                        break
                    except httpx.TransportError:  # the keep-alive connection closed meanwhile (after a stall of
                        pass  # more than uvicorn's 5 s keep-alive): asked again, the wait still counted from here
                probes.append((asked, time.monotonic()))
                time.sleep(probe_every)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    size, end_began = posted(url, path, body)
    ended = time.monotonic()
    done.set()
    thread.join()
    waits = [answered - asked for asked, answered in probes]
    at_end = [answered - asked for asked, answered in probes
              if end_began is not None and answered > end_began and asked < ended]
    return ended - started, size, max(waits, default=0.0), max(at_end, default=0.0), len(probes)


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
    cases["responses-stream"] = (cases["responses"][0], {**cases["responses"][1], "stream": True})
    cases["chat-stream"] = (cases["chat"][0], {**cases["chat"][1], "stream": True})
    try:
        for name in args.cases.split(","):
            path, body = cases[name]
            rss = peak_rss(process.pid, reset=True)
            alone = measure(url, path, body, 0)[0]
            peak = peak_rss(process.pid)  # the server's peak memory over the request alone
            took, size, stall, at_end, answers = measure(url, path, body, args.probe_every)
            end = f", at the stream's end {at_end:6.3f} s" if body.get("stream") else ""
            print(f"{name:16s} reply {alone:6.2f} s alone, {took:6.2f} s probed  body {size / 1e6:7.1f} MB  "
                  f"longest /health wait {stall:6.3f} s{end} ({answers} answers)  RSS {rss / 1e9:.2f} GB, "
                  f"{peak / 1e9:.2f} GB at most over the reply alone",
                  flush=True)
    finally:
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    main()

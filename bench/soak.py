"""Soak: many streaming requests with random client disconnects; afterwards, nothing may be left behind.

    OMP_NUM_THREADS=1 python bench/soak.py --requests 10000 --concurrency 64 --rounds 10 --max-tokens 4 \\
        --serve-args "--dtype float32" --json bench/results/soak-cpu-2026-12-03.json

Starts `flotilla serve` (the embedded model unless --model) on a free loopback port, then sends
--requests streaming /v1/completions and /v1/chat/completions with short prompts, --concurrency at a
time, in --rounds equal rounds. A --disconnect-rate share of them hang up after the first few chunks:
half with a clean close (FIN), half with a reset (SO_LINGER 0, RST). Clients speak HTTP/1.1 through
h11 on raw sockets so that each hang-up is exactly the one asked for.

Reports, per round: requests, non-2xx answers, streams that completed with [DONE], disconnects by kind,
wall time, and the server's RSS (VmRSS of its process) once the round is over. At the end, once the
server is idle: its KV-cache usage, running and waiting requests from /metrics (vLLM's gauges), which
must all be 0 — a leaked request or KV block shows up there.

On the shared 2-core CPU machines, OMP_NUM_THREADS=1 and float32 keep a round short: with other jobs
on the cores, torch's OpenMP threads spin against each other (a 4-token request took 5-8 s with the
default threads, 0.5 s with one), and bf16 matmuls are several times slower than float32 on a CPU
without bf16 instructions (64 such requests: 21 s in bf16, 3 s in float32, measured 2026-12-03).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import h11
import httpx

PROMPTS = ["The sea at dawn", "Tell me about ships", "Once upon a time", "List three colours", "Why is the sky blue?",
           "A haiku on rain", "Count to five", "The capital of France is"]


async def one_request(port: int, rng: random.Random, args: argparse.Namespace) -> str:
    """One streaming request; returns its outcome: 'done', 'fin', 'rst', 'http-<status>' or 'error-<kind>'."""
    chat = rng.random() < 0.5
    prompt = rng.choice(PROMPTS)
    body = {"model": args.model_name, "max_tokens": args.max_tokens, "stream": True, "temperature": 0.8,
            "seed": rng.randrange(2**31)}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    payload = json.dumps(body).encode()
    hang_up = rng.choice(["fin", "rst"]) if rng.random() < args.disconnect_rate else None
    after_chunks = rng.randint(1, 3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h11.Connection(h11.CLIENT)
    try:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        request = h11.Request(method="POST", target=path, headers=[
            ("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Content-Length", str(len(payload))),
            ("Connection", "close")])
        writer.write(conn.send(request) + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
        await writer.drain()
        chunks, text = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(65536), timeout=args.request_timeout)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response) and not 200 <= event.status_code < 300:
                return f"http-{event.status_code}"
            if isinstance(event, h11.Data):
                chunks += 1
                text += bytes(event.data)
                if hang_up and chunks >= after_chunks:
                    if hang_up == "rst":  # close with a reset instead of a FIN
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return hang_up
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return "done" if text.rstrip().endswith(b"data: [DONE]") else "error-truncated"
    except (TimeoutError, h11.RemoteProtocolError, OSError) as exc:
        return f"error-{type(exc).__name__}"
    finally:
        writer.close()


async def one_round(port: int, n: int, rng: random.Random, args: argparse.Namespace) -> Counter:
    """n requests, args.concurrency at a time."""
    outcomes: Counter = Counter()
    remaining = iter(range(n))

    async def worker() -> None:
        for _ in remaining:
            outcomes[await one_request(port, rng, args)] += 1

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return outcomes


def rss_mib(pid: int) -> float:
    """The process's resident set (VmRSS) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gauges(url: str) -> dict[str, float]:
    """vLLM's load gauges from /metrics, summed over label sets."""
    wanted = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
    values = dict.fromkeys(wanted, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def wait_idle(url: str, timeout: float = 60.0) -> dict[str, float]:
    """The gauges once they read all-zero, or after `timeout` (whatever they read then)."""
    deadline = time.monotonic() + timeout
    while True:
        values = gauges(url)
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.5)


def launch(args: argparse.Namespace) -> tuple[subprocess.Popen, int, list[str]]:
    """Start `flotilla serve` on a free loopback port and wait for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "flotilla.engine.server", *([args.model] if args.model else []), "--host",
           "127.0.0.1", "--port", str(port), "--served-model-name", args.model_name, "--uvicorn-log-level",
           "warning", *shlex.split(args.serve_args)]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115 - lives with the server
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}: {shlex.join(cmd)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process, port, cmd
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("server did not become healthy")


def main() -> None:
    """Run the rounds, print one line per round and the verdict, write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the embedded model)")
    p.add_argument("--model-name", default="soak")
    p.add_argument("--serve-args", default="", help="extra flotilla serve flags")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--disconnect-rate", type=float, default=0.3)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds without a byte before giving up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-log", default=None, help="file for the server's log (default: discarded)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rng = random.Random(args.seed)
    process, port, cmd = launch(args)
    url = f"http://127.0.0.1:{port}"
    rounds = []
    try:
        base_rss = rss_mib(process.pid)
        print(f"server up, RSS {base_rss:.0f} MiB")
        per_round = args.requests // args.rounds
        for i in range(args.rounds):
            started = time.monotonic()
            outcomes = asyncio.run(one_round(port, per_round, rng, args))
            idle = wait_idle(url)
            row = {"round": i + 1, "requests": per_round, "wall_s": round(time.monotonic() - started, 1),
                   "outcomes": dict(sorted(outcomes.items())),
                   "non_2xx": sum(v for k, v in outcomes.items() if k.startswith("http-")),
                   "rss_mib": round(rss_mib(process.pid), 1), "idle_gauges": idle}
            rounds.append(row)
            print(json.dumps(row))
        final = wait_idle(url)
        alive = httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=60)
    totals: Counter = Counter()
    for row in rounds:
        totals.update(row["outcomes"])
    summary = {
        "command": " ".join([*(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS",) if k in os.environ),
                             shlex.join(["python", *sys.argv])]),
        "server_command": shlex.join(cmd[1:]),
        "requests": sum(r["requests"] for r in rounds), "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "disconnect_rate": args.disconnect_rate,
        "outcomes": dict(sorted(totals.items())),
        "non_2xx": sum(r["non_2xx"] for r in rounds),
        "errors": sum(v for k, v in totals.items() if k.startswith("error-")),
        "final_gauges": final, "leaked_kv": final["vllm:kv_cache_usage_perc"] != 0,
        "health_after": alive, "rss_start_mib": round(base_rss, 1), "rss_per_round_mib": [r["rss_mib"] for r in rounds],
        "wall_s": round(sum(r["wall_s"] for r in rounds), 1), "rounds": rounds,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

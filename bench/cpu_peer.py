"""Flotilla against llama.cpp's server on the CPU, side by side in one run (issue 19's CPU row).

    python bench/cpu_peer.py --llama-python /tmp/llama-venv/bin/python --rounds 3 \\
        --out bench/results/cpu-2026-12-04-s7

Both servers run the embedded model, from the same file: Flotilla serves `flotilla serve` (the GGUF
dequantized to bf16 by `engine/embedded_model.py`, or what --flotilla-args ask, e.g. `--dtype float32`),
llama.cpp serves the GGUF itself through llama-cpp-python's OpenAI server (`python -m llama_cpp.server`,
Q4_1 linear layers and a Q8_0 embedding/LM head, as shipped). Both get --threads threads and stay up
for the whole run; each measured workload runs on one server while the other idles.

Workloads, each on both servers in every round (which server goes first alternates by round):
  single stream: --c1-prompts requests one after another (concurrency 1);
  8 streams:     --c8-prompts requests, 8 at a time.
Each request is a window of --input-len tokens of English text (bench/data, different for every request
of the run, so neither server's prefix cache serves it), sent as text to /v1/completions with greedy
sampling, `min_tokens` = `max_tokens` = --output-len (Flotilla also gets ignore_eos; llama.cpp
repeat_penalty 1.0, its default being 1.1), streamed. llama-cpp-python streams no usage: a stream
that ends with finish_reason "length" is counted as --output-len tokens. llama.cpp runs with
`--interrupt_requests False` (by default a new request cuts the running one short).

Reports per round and server: output tok/s, TTFT, TPOT (decode time per token) and the load average
when it ran (the machine is shared); then medians over rounds and the ratios issue 19 asks for:
8-stream output tok/s Flotilla / llama.cpp (floor 2x) and single-stream decode speed, llama.cpp's
TPOT / Flotilla's (floor 0.8x). Writes `peer.json` and each run's summary under --out.

Without llama.cpp, `--peer-flotilla-args` makes a second Flotilla configuration the peer (the same workloads, the
same alternation, the ratios against it), e.g. the GGUF's own Q4_1 codes against RTN's re-rounded weights:

    python bench/cpu_peer.py --flotilla-args '--quantization gguf' --peer-name rtn4g32 \
        --peer-flotilla-args '--quantization rtn' --peer-flotilla-env RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 \
        --out bench/results/cpu-2026-12-04-s10-gguf/gguf-vs-rtn
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
from serve import launch, one_request, summarize

from flotilla.engine.embedded_model import embedded_gguf_path, embedded_model_dir

DATA = Path(__file__).parent / "data"


def text_windows(tokenizer, count: int, length: int, seed: int, used: set[int]) -> list[tuple[str, int]]:
    """`count` windows of about `length` tokens of the bench/data texts as (text, token count), each from
    an offset not used before in this run."""
    ids = tokenizer.encode("\n\n".join(p.read_text() for p in sorted(DATA.glob("*.txt"))))
    rng = random.Random(seed)
    windows = []
    while len(windows) < count:
        start = rng.randrange(0, len(ids) - length)
        if start in used:
            continue
        used.add(start)
        text = tokenizer.decode(ids[start : start + length])
        windows.append((text, len(tokenizer.encode(text))))
    return windows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_llamacpp(python: str, gguf: Path, threads: int, n_ctx: int, log: str | None) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's OpenAI server on a free loopback port, ready."""
    port = free_port()
    cmd = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
           "--interrupt_requests", "False", "--model_alias", "llama.cpp"]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (the server's lifetime)
    # Not from the repository root: its `operator/` folder would shadow the standard library's.
    process = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama.cpp server exited with {process.returncode}: {shlex.join(cmd)}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("llama.cpp server did not become ready")


async def run_load(url: str, model: str, prompts: list[tuple[str, int]], concurrency: int, output_len: int,
                   extra: dict) -> tuple[list, float]:
    """Send every prompt, `concurrency` at a time, one connection per slot; returns results and wall s."""
    free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    clients = [httpx.AsyncClient(timeout=httpx.Timeout(3600)) for _ in range(concurrency)]
    for c in clients:
        free.put_nowait(c)

    async def limited(text: str, n: int):
        http = await free.get()
        try:
            result = await one_request(http, url, model, text, output_len, None, extra)
            result.prompt_len = n
            return result
        finally:
            free.put_nowait(http)

    try:
        start = time.perf_counter()
        results = await asyncio.gather(*(limited(t, n) for t, n in prompts))
        return list(results), time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def measure(name: str, url: str, model: str, prompts: list[tuple[str, int]], concurrency: int, output_len: int,
            extra: dict) -> dict:
    load_before = os.getloadavg()
    results, wall = asyncio.run(run_load(url, model, prompts, concurrency, output_len, extra))
    summary = summarize(results, wall, SimpleNamespace(goodput=None))
    summary.update(server=name, concurrency=concurrency, loadavg_before=load_before, loadavg_after=os.getloadavg(),
                   prompt_tokens=[n for _, n in prompts])
    print(f"  {name:<9} c={concurrency}: {summary['output_throughput']:7.1f} output tok/s, TPOT p50 "
          f"{summary['median_tpot_ms']:6.1f} ms, TTFT p50 {summary['median_ttft_ms']:7.0f} ms, "
          f"{summary['completed']}/{len(prompts)} ok, load {load_before[0]:.1f}", flush=True)
    if summary["failed"]:
        print(f"    first error: {summary.get('first_error')}", flush=True)
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-python", help="the interpreter of a venv with llama-cpp-python[server]")
    p.add_argument("--peer-flotilla-args", default=None,
                   help="without llama.cpp: a second Flotilla server with these `flotilla serve` flags is the peer "
                   "(e.g. '--quantization rtn')")
    p.add_argument("--peer-flotilla-env", nargs="*", default=[], help="KEY=VALUE for the peer Flotilla's environment")
    p.add_argument("--peer-name", default="flotilla-peer", help="the peer Flotilla's name in the report")
    p.add_argument("--flotilla-args", default="", help="extra `flotilla serve` flags (e.g. '--dtype float32')")
    p.add_argument("--flotilla-env", nargs="*", default=[],
                   help="KEY=VALUE for the Flotilla server's environment only (e.g. RTN_NUM_BITS=4 "
                   "OMP_WAIT_POLICY=PASSIVE)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (Flotilla's torch uses every core)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=210)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--c1-prompts", type=int, default=4)
    p.add_argument("--c8-prompts", type=int, default=8)
    p.add_argument("--out", required=True, help="folder for peer.json and the servers' logs")
    args = p.parse_args()
    if (args.llama_python is None) == (args.peer_flotilla_args is None):
        p.error("give one peer: --llama-python (llama.cpp) or --peer-flotilla-args (a second Flotilla)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model_dir = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    gguf = embedded_gguf_path()
    used: set[int] = set()
    flags = f"--max-model-len 2048 {args.flotilla_args}"
    flotilla, flotilla_url = launch_flotilla(flags, args.flotilla_env, str(out / "flotilla-server.log"))
    peer_name = "llama.cpp" if args.llama_python else args.peer_name
    peer_flags = f"--max-model-len 2048 {args.peer_flotilla_args or ''}"
    try:
        if args.llama_python:
            llama, llama_url = launch_llamacpp(args.llama_python, gguf, args.threads, 2048,
                                               str(out / "llamacpp-server.log"))
        else:
            llama, llama_url = launch_flotilla(peer_flags, args.peer_flotilla_env, str(out / "peer-server.log"))
    except BaseException:
        flotilla.terminate()
        raise
    servers = {
        "flotilla": (flotilla_url, httpx.get(f"{flotilla_url}/v1/models").json()["data"][0]["id"], {}),
        peer_name: (llama_url, "llama.cpp", {"repeat_penalty": 1.0, "top_k": 1}) if args.llama_python else
        (llama_url, httpx.get(f"{llama_url}/v1/models").json()["data"][0]["id"], {}),
    }
    runs: list[dict] = []
    try:
        for name, (url, model, extra) in servers.items():  # warm-up: every shape once, unmeasured
            print(f"warm-up {name}", flush=True)
            for c in (1, 8):
                asyncio.run(run_load(url, model, text_windows(tokenizer, c, args.input_len, 99 + c, used), c,
                                     16, extra))
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for c, n in ((1, args.c1_prompts), (8, args.c8_prompts)):
                for name in order:
                    url, model, extra = servers[name]
                    prompts = text_windows(tokenizer, n, args.input_len, 1000 * r + 10 * c + len(name), used)
                    summary = measure(name, url, model, prompts, c, args.output_len, extra)
                    summary["round"] = r
                    runs.append(summary)
    finally:
        for process in (flotilla, llama):
            process.terminate()
            process.wait(timeout=60)
    report = {"command": "python bench/cpu_peer.py " + shlex.join(sys.argv[1:]), "runs": runs,
              "flotilla_flags": flags, "flotilla_env": args.flotilla_env,
              "peer": f"llama-cpp-python, {gguf.name}, {args.threads} threads" if args.llama_python else
              {"flotilla_flags": peer_flags, "flotilla_env": args.peer_flotilla_env},
              "medians": medians(runs, peer_name)}
    (out / "peer.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report["medians"], indent=2))


def launch_flotilla(flags: str, env: list[str], log: str) -> tuple[subprocess.Popen, str]:
    """`flotilla serve` (the embedded model unless `flags` name one) with KEY=VALUE `env` in its environment."""
    serve_args = SimpleNamespace(server_python_args="", model=None, serve_args=flags, server_log=log)
    saved = dict(os.environ)
    os.environ.update(kv.split("=", 1) for kv in env)  # this server's alone
    try:
        return launch(serve_args)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def medians(runs: list[dict], peer: str = "llama.cpp") -> dict:
    """Per server and concurrency: the median over rounds of each figure; then the ratios of the issue (against
    `peer`: llama.cpp, or a second Flotilla configuration)."""
    table: dict[str, dict] = {}
    for name in ("flotilla", peer):
        for c in (1, 8):
            mine = [r for r in runs if r["server"] == name and r["concurrency"] == c]
            if mine:
                table[f"{name} c{c}"] = {k: statistics.median(r[k] for r in mine) for k in
                                         ("output_throughput", "median_tpot_ms", "median_ttft_ms")}
    try:
        table[f"ratio 8-stream output tok/s (flotilla / {peer}, floor 2.0 vs llama.cpp)"] = (
            table["flotilla c8"]["output_throughput"] / table[f"{peer} c8"]["output_throughput"])
        table[f"ratio single-stream decode speed ({peer} TPOT / flotilla TPOT, floor 0.8 vs llama.cpp)"] = (
            table[f"{peer} c1"]["median_tpot_ms"] / table["flotilla c1"]["median_tpot_ms"])
        table[f"ratio single-stream output tok/s incl. prefill (flotilla / {peer})"] = (
            table["flotilla c1"]["output_throughput"] / table[f"{peer} c1"]["output_throughput"])
    except (KeyError, ZeroDivisionError):
        pass
    return table


if __name__ == "__main__":
    main()

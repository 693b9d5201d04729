"""How much a large reply built on a worker thread slows /health, a small request and the engine's outputs (CPU).

A Responses stream's closing events each carry the whole output's logprobs (`--tokens` tokens of `--top-logprobs`
alternatives: 400k entries by default); they are built and encoded on a worker thread of the API process
(json_reply.off_the_loop). That thread holds the GIL while it runs Python, and every other thread of the process
(the event loop, the engine-output thread, the command sender) waits for it at each GIL hand-off: up to the switch
interval (5 ms by default) at every I/O call or torch op that dropped it.

This starts a server on a tiny random Llama (2 layers, hidden 64, the embedded model's tokenizer), asks /health
every `--probe-every` s and sends small completions (`--small-tokens` tokens each) one after another, first alone
for `--alone` s, then while `--rounds` big streams run one after another. It prints p50 / max of each latency: alone,
over the big streams' engine part, and over their ends (from the last delta before `response.output_text.done` to
the stream's end; the worker thread's part), the end's length, and the small requests' tokens per second meanwhile.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gil_stall.py [--switch-interval 0.005] [--json OUT.json]

`--switch-interval`: the server process's `sys.setswitchinterval` (none: the server's own, cli.SWITCH_INTERVAL).
The server's stderr lines `GC-PAUSE` (collections of 20 ms or more) are counted per phase: a collection holds the
GIL throughout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from local_server import free_port, wait_until_serving

# The server, with its switch interval set (argv[1]; "-": the server's own, cli.SWITCH_INTERVAL) and each garbage
# collection of 20 ms or more logged to stderr ("GC-PAUSE generation ms thread"): a collection holds the GIL
# throughout, on whichever thread set it off, and its length grows with the tracked objects alive.
SERVER = """
import gc, runpy, sys, threading, time
interval = sys.argv.pop(1)
if interval != "-":
    import os
    os.environ["FLOTILLA_API_SWITCH_INTERVAL"] = interval  # the server sets it once started
began = [0.0]
def timed(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    elif (took := time.perf_counter() - began[0]) >= 0.02:
        print(f"GC-PAUSE {info['generation']} {took * 1e3:.0f} {threading.current_thread().name}", file=sys.stderr,
              flush=True)
gc.callbacks.append(timed)
runpy.run_module("flotilla.engine.server", run_name="__main__", alter_sys=True)
"""


def tiny_llama(root: Path) -> Path:
    """The tests' tiny Llama (tests/conftest.py): 2 layers, hidden 64, the embedded model's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from flotilla.engine.embedded_model import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False, initializer_range=0.1)
    torch.manual_seed(1000)
    path = root / "llama"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def start(model: Path, switch_interval: float | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVER, str(switch_interval or "-"), str(model),
                                "--port", str(port), "--max-model-len", "512",
                                "--served-model-name", "tiny", "--max-logprobs", "1000", "--disable-log-stats",
                                "--uvicorn-log-level", "warning"], stderr=subprocess.PIPE, text=True)
    threading.Thread(target=pauses, args=(process,), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, url)
    return process, url


GC_PAUSES: list[tuple[float, int, float, str]] = []  # (logged at, generation, ms, thread) of the server's


def pauses(process: subprocess.Popen) -> None:
    """Pass the server's stderr on, keeping its GC-PAUSE lines (when they came) in `GC_PAUSES`."""
    for line in process.stderr:
        if line.startswith("GC-PAUSE "):
            _, generation, ms, thread = line.split()
            GC_PAUSES.append((time.monotonic(), int(generation), float(ms), thread))
        else:
            sys.stderr.write(line)


Sample = tuple[float, float]  # (sent, answered), time.monotonic()


def probes(url: str, every: float, small_tokens: int, stop: threading.Event) -> tuple[list[Sample], list[Sample]]:
    """/health every `every` s and small completions back to back, until `stop`: their (sent, answered)."""
    health: list[Sample] = []
    small: list[Sample] = []

    def health_loop() -> None:
        with httpx.Client(timeout=600) as client:
            while not stop.is_set():
                sent = time.monotonic()
                assert client.get(f"{url}/health").status_code == 200
                health.append((sent, time.monotonic()))
                time.sleep(every)

    def small_loop() -> None:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": small_tokens, "ignore_eos": True}
        with httpx.Client(timeout=600) as client:
            while not stop.is_set():
                sent = time.monotonic()
                response = client.post(f"{url}/v1/completions", json=body)
                assert response.status_code == 200, response.text
                small.append((sent, time.monotonic()))

    threads = [threading.Thread(target=health_loop), threading.Thread(target=small_loop)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join()
    return health, small


def big_stream(url: str, tokens: int, top_logprobs: int) -> tuple[float, float, float, int]:
    """One big Responses stream: (sent, its end began (the arrival of the last piece before the one holding
    `response.output_text.done`), ended, its bytes). Read in a process of its own (`big_streams`)."""
    body = {"model": "tiny", "input": "hi", "max_output_tokens": tokens, "ignore_eos": True, "stream": True,
            "include": ["message.output_text.logprobs"], "top_logprobs": top_logprobs}
    mark = b"event: response.output_text.done"
    sent = time.monotonic()
    end_began, last, size, tail = None, sent, 0, b""
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=600) as response:
        assert response.status_code == 200
        for piece in response.iter_raw():
            size += len(piece)
            if end_began is None and mark in tail + piece[:len(mark) + 1]:
                end_began = last
            elif end_began is None and mark in piece:
                end_began = time.monotonic()  # the end began within this piece: its arrival is the closest mark
            tail, last = piece[-len(mark):], time.monotonic()
    assert end_began is not None
    return sent, end_began, time.monotonic(), size


def big_streams(url: str, rounds: int, tokens: int, top_logprobs: int) -> list[tuple[float, float, float, int]]:
    """`rounds` big streams one after another, read by a process of its own: read on a thread of this one, the
    120 MB it parses would hold this process's GIL, and the probes' threads would wait for it (the very convoy
    measured here, on the client's side). time.monotonic() is one clock for every process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.starmap(big_stream, [(url, tokens, top_logprobs)] * rounds)


def server_switch_interval() -> float:
    """The switch interval the server sets (cli.switch_interval(); Python's before the server set one)."""
    import flotilla.engine.server.cli as cli

    return cli.switch_interval() if hasattr(cli, "switch_interval") else sys.getswitchinterval()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def summary(samples: list[Sample], spans: list[tuple[float, float]]) -> dict[str, float]:
    """p50 / max latency (ms) of the samples that overlap one of `spans`, and how many."""
    waits = [answered - sent for sent, answered in samples
             if any(sent < end and answered > begin for begin, end in spans)]
    return {"n": len(waits), "p50_ms": round(pct(waits, 50) * 1e3, 1), "max_ms": round(max(waits, default=0) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=400, help="the big stream's output tokens")
    parser.add_argument("--top-logprobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="big streams, one after another")
    parser.add_argument("--alone", type=float, default=10.0, help="seconds of probes without a big stream")
    parser.add_argument("--small-tokens", type=int, default=8)
    parser.add_argument("--probe-every", type=float, default=0.02)
    parser.add_argument("--switch-interval", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        process, url = start(tiny_llama(Path(root)), args.switch_interval)
        try:
            stop = threading.Event()
            result: dict[str, object] = {}
            runner = threading.Thread(target=lambda: result.update(zip(
                ("health", "small"), probes(url, args.probe_every, args.small_tokens, stop), strict=True)))
            runner.start()
            began = time.monotonic()
            time.sleep(args.alone)
            alone = [(began + 1.0, time.monotonic())]  # the first second: connections, warm-up
            bigs = big_streams(url, args.rounds, args.tokens, args.top_logprobs)
            stop.set()
            runner.join()
        finally:
            process.terminate()
            process.wait(60)
    health, small = result["health"], result["small"]
    engine_part = [(sent, end_began) for sent, end_began, _, _ in bigs]
    ends = [(end_began, ended) for _, end_began, ended, _ in bigs]
    figures: dict[str, object] = {"switch_interval": args.switch_interval or server_switch_interval(),
                                  "big_tokens": args.tokens, "top_logprobs": args.top_logprobs,
                                  "small_tokens": args.small_tokens, "cpus": os.cpu_count(),
                                  "big_bytes": bigs[0][3],
                                  "engine_part_s": [round(e - s, 2) for s, e in engine_part],
                                  "end_s": [round(e - s, 2) for s, e in ends]}
    for name, spans in (("alone", alone), ("engine_part", engine_part), ("end", ends)):
        figures[name] = {"health": summary(health, spans), "small": summary(small, spans)}
        inside = [(s, a) for s, a in small if any(s >= b and a <= e for b, e in spans)]
        span_s = sum(e - b for b, e in spans)
        figures[name]["small_tokens_per_s"] = round(len(inside) * args.small_tokens / span_s, 1)
        logged = [(generation, ms) for at, generation, ms, _ in GC_PAUSES if any(b <= at <= e for b, e in spans)]
        collections = [ms for _, ms in logged]
        figures[name]["gc_pauses_20ms"] = {"n": len(collections), "sum_ms": round(sum(collections)),
                                           "max_ms": max(collections, default=0),
                                           # young (0, 1) or full (2): which the live heap's size drives
                                           "by_generation": [sum(gen == g for gen, _ in logged) for g in range(3)]}
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()

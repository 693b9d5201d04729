"""What a large reply encoded on a worker thread costs the process's other threads at each GIL hand-off (CPU).

One thread encodes a large Responses end (`--tokens` entries of `--top-logprobs` alternatives) with the server's own
piece encoder (json_reply.json_pieces, pieces of `--piece-values`) over and over, as a large reply's worker thread
does (`--work build`: builds the event's logprobs instead, Python bytecode). Meanwhile this thread
either sleeps 1 ms at a time (as the event loop's thread waits in epoll and the engine-output thread in a pipe read:
each wake-up must take the GIL back) or runs small torch ops (the engine's thread when it shares the process,
VLLM_ENABLE_V1_MULTIPROCESSING=0: each op drops the GIL and takes it back). Printed: the wake-ups' lateness p50 /
p99 / max, the ops' rate and the worker's (characters or entries a second), alone and beside the worker, for each
setting under test:

    OMP_NUM_THREADS=1 .venv/bin/python bench/gil_handoff.py --switch-intervals 0.005,0.001,0.0005 \
        --piece-pauses none,0,0.00005

`--switch-intervals`: sys.setswitchinterval values; `--piece-pauses`: what the encoder does after each piece
("none": nothing, a number: time.sleep of it, GIL released).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import torch

from flotilla.engine.server import json_reply
from flotilla.engine.server.json_reply import json_pieces
from flotilla.engine.server.responses_items import event_logprobs


def big_value(tokens: int, top: int) -> dict[str, Any]:
    """A `response.output_text.done` event's fields with `tokens` logprob entries of `top` alternatives each."""
    return {"type": "response.output_text.done", "sequence_number": 1, "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "text": "a" * tokens,
            "logprobs": [{"token": "a", "logprob": -1.0,
                          "top_logprobs": [{"token": f"t{i}", "logprob": -2.5 - i} for i in range(top)]}
                         for _ in range(tokens)]}


def encoder(value: Any, pause: float | None, stop: threading.Event, count: list[int]) -> None:
    """Encode `value` in pieces until `stop`, pausing `pause` s (GIL released) after each piece; `count`: the
    characters encoded."""
    while not stop.is_set():
        for piece in json_pieces(value):
            count[0] += len(piece)
            if pause is not None:
                time.sleep(pause)
            if stop.is_set():
                return


def builder(value: Any, pause: float | None, stop: threading.Event, count: list[int]) -> None:
    """Build the event's logprobs (`event_logprobs`, Python bytecode: the switch interval hands the GIL over) from
    `value`'s until `stop`; `count`: the entries built. (`pause` unused: there are no pieces.)"""
    while not stop.is_set():
        count[0] += len(event_logprobs(value["logprobs"]))


def wakeups(seconds: float) -> list[float]:
    """Lateness (s) of 1 ms sleeps over `seconds`."""
    late = []
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        time.sleep(0.001)
        late.append(time.perf_counter() - now - 0.001)
    return late


def op_rate(seconds: float) -> float:
    """Small torch ops a second (a tiny model's step is a few hundred of them)."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    done = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            a = torch.tanh(a @ b)
        done += 100
    return done / seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def measure(value: Any | None, pause: float | None, seconds: float, work: str) -> dict[str, float]:
    """The wake-ups' lateness (ms) and the op rate, beside `work` on `value` (None: alone)."""
    stop = threading.Event()
    count = [0]
    target = encoder if work == "encode" else builder
    thread = threading.Thread(target=target, args=(value, pause, stop, count)) if value is not None else None
    if thread:
        thread.start()
    began = time.perf_counter()
    late = wakeups(seconds)
    ops = op_rate(seconds)
    stop.set()
    if thread:
        thread.join()
    return {"wake_p50_ms": round(pct(late, 50) * 1e3, 3), "wake_p99_ms": round(pct(late, 99) * 1e3, 3),
            "wake_max_ms": round(max(late) * 1e3, 3), "ops_per_s": round(ops),
            "work_per_s": round(count[0] / (time.perf_counter() - began))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--top-logprobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0, help="each measurement's (wake-ups, then ops)")
    parser.add_argument("--switch-intervals", default="0.005,0.001,0.0005")
    parser.add_argument("--piece-pauses", default="none,0,0.00005")
    parser.add_argument("--piece-values", default=str(json_reply.PIECE_VALUES), help="json_reply.PIECE_VALUES values")
    parser.add_argument("--work", default="encode", choices=["encode", "build"],
                        help="the worker's: encode in pieces (C calls), or build the event's logprobs (bytecode)")
    parser.add_argument("--repeats", type=int, default=1, help="the whole grid, this many times over")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    value = big_value(args.tokens, args.top_logprobs)
    rows = []
    grid = [(float(interval), int(values), name) for interval in args.switch_intervals.split(",")
            for values in args.piece_values.split(",") for name in ["alone", *args.piece_pauses.split(",")]]
    for _ in range(args.repeats):
        for interval, values, name in grid:
            sys.setswitchinterval(interval)
            json_reply.PIECE_VALUES = values
            pause = None if name in ("none", "alone") else float(name)
            row = {"switch_interval": interval, "piece_values": values, "work": args.work,
                   "encoder": "none" if name == "alone" else f"pause {name}",
                   **measure(None if name == "alone" else value, pause, args.seconds, args.work)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

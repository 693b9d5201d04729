"""CPU ms of one stream step's logprobs (one token, N alternatives) built and encoded, as on the event loop.

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/loopdelta-cpu-2026-12-07-s31/step_cost.py 20 250 500 1000
"""

from __future__ import annotations

import functools
import random
import sys
import time
from collections.abc import Callable

from transformers import AutoTokenizer

from flotilla.engine.embedded_model import embedded_model_dir
from flotilla.engine.server.json_reply import json_values
from flotilla.engine.server.responses_items import event_logprobs
from flotilla.engine.server.serving import OpenAIServing
from flotilla.engine.server.sse import json_text

ROUNDS = 50


def cpu_ms(step: Callable[[], object]) -> float:
    """Mean CPU milliseconds of `step()` over ROUNDS calls."""
    began = time.process_time()
    for _ in range(ROUNDS):
        step()
    return (time.process_time() - began) / ROUNDS * 1e3


def chat_step(serving: OpenAIServing, token: int, entry: dict[int, tuple[float, int]], n: int) -> str:
    """A chat chunk's logprobs, encoded."""
    return json_text(serving._chat_logprobs([token], [entry], n))


def responses_step(serving: OpenAIServing, token: int, entry: dict[int, tuple[float, int]], n: int) -> str:
    """A Responses `output_text.delta`'s logprobs (converted from chat's, as the stream does), encoded."""
    return json_text(event_logprobs(serving._chat_logprobs([token], [entry], n)["content"]))


def main() -> None:
    serving = OpenAIServing(None, AutoTokenizer.from_pretrained(embedded_model_dir()), 512, 49152)
    rng = random.Random(0)
    for n in (int(x) for x in sys.argv[1:]):
        ids = rng.sample(range(49152), n + 1)
        entry = {t: (-rng.random() * 10, r) for r, t in enumerate(ids)}
        chat = serving._chat_logprobs([ids[0]], [entry], n)  # also fills the token-text cache, as a running server's
        values = json_values(chat, 10**9)
        for name, step in (("chat", chat_step), ("responses", responses_step)):
            ms = cpu_ms(functools.partial(step, serving, ids[0], entry, n))
            print(f"{name} alternatives={n} cpu_ms_per_step={ms:.2f} chat_json_values={values}")

if __name__ == "__main__":
    main()

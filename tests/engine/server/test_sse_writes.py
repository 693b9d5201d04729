"""How streamed choices reach the socket (engine/server/sse.py, serving.py, tool_stream.py): one SSE event per
choice, as OpenAI and vLLM send them, and one step's events in one write."""

from __future__ import annotations

import json
import re
import socket
from collections import Counter

import pytest

from .conftest import API_KEY

N = 8
EVENT = re.compile(rb"data: (\{.*?\})\n\n")


def _raw_stream(server, path: str, body: dict) -> tuple[bytes, list[int]]:
    """The response bytes of a streamed request over a plain socket, and where each recv() ended: a recv returns
    what one or more writes put in the socket, and on loopback never part of a small write."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    data, ends = b"", []
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(head.encode() + payload)
        while piece := sock.recv(1 << 20):
            data += piece
            ends.append(len(data))
    return data, ends


def _split_steps(data: bytes, ends: list[int]) -> list[Counter]:
    """Per recv boundary, how many events each choice index had sent by then (choice events only)."""
    events = [(m.end(), json.loads(m.group(1))) for m in EVENT.finditer(data)]
    seen = []
    for end in ends:
        seen.append(Counter(e["choices"][0]["index"] for stop, e in events if stop <= end and e["choices"]))
    return seen


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "The harbour"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "The harbour"}]}),
])
def test_n_choices_stream_one_event_each_and_one_write_per_step(server, path, body):
    # Every choice advances each step (ignore_eos, min_tokens): a recv that ends between two choices' events of one
    # step shows they were written apart. They were: n writes (and n event-loop turns) per step.
    request = {"model": "tiny", **body, "n": N, "max_tokens": 12, "min_tokens": 12, "ignore_eos": True,
               "stream": True, "seed": 1}
    data, ends = _raw_stream(server, path, request)
    assert data.startswith(b"HTTP/1.1 200")
    events = [json.loads(m.group(1)) for m in EVENT.finditer(data)]
    choice_events = [e for e in events if e["choices"]]
    assert all(len(e["choices"]) == 1 for e in choice_events)  # OpenAI's framing: one choice an event
    per_choice = Counter(e["choices"][0]["index"] for e in choice_events)
    assert sorted(per_choice) == list(range(N)) and len(set(per_choice.values())) == 1
    for seen in _split_steps(data, ends):
        assert len(set(seen[i] for i in range(N))) == 1, f"a step's events were split across writes: {seen}"

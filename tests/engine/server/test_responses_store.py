"""The Responses API's store (engine/server/responses.py) keeps each response as its JSON body."""

from __future__ import annotations

import gc
import json

import pytest

from flotilla.engine.server.errors import APIError
from flotilla.engine.server.responses import ResponseStore, stored

ENTRIES = 50_000


def _response_with_logprobs(response_id: str) -> dict:
    entry = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
    part = {"type": "output_text", "text": "a" * ENTRIES, "annotations": [],
            "logprobs": [dict(entry, top_logprobs=[dict(entry)]) for _ in range(ENTRIES)]}
    return {"id": response_id, "object": "response", "status": "completed",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "content": [part]}]}


def test_a_stored_response_leaves_nothing_for_the_garbage_collector_to_walk():
    # Kept as dicts, a response with output logprobs was millions of objects alive in the store, which every full
    # collection (on the event loop) walked: /health waited 12 s behind one of 1.57M entries (bench/reply_stall.py).
    store = ResponseStore()
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a" * ENTRIES}]
    gc.collect()
    before = len(gc.get_objects())
    response = _response_with_logprobs("resp_1")
    store.put(stored(response, conversation))
    expected = json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode()
    del response
    gc.collect()
    assert len(gc.get_objects()) - before < 100  # not the 100k entries' dicts and lists
    entry = store.get("resp_1")
    assert entry.body == expected  # the body GET sends: JSONResponse's bytes of the response
    assert entry.conversation == conversation
    assert store.num_bytes == entry.size == len(expected) + len(json.dumps(conversation))


def test_the_byte_bound_drops_the_oldest_by_their_stored_size():
    first = stored(_response_with_logprobs("resp_1"), [])
    store = ResponseStore(max_bytes=first.size + 10)
    store.put(first)
    store.put(stored({"id": "resp_2", "output": []}, []))
    with pytest.raises(APIError) as dropped:
        store.get("resp_1")
    assert dropped.value.status == 404
    assert store.get("resp_2").body == b'{"id":"resp_2","output":[]}' and store.num_bytes == store.get("resp_2").size

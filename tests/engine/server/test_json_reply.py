"""engine/server/json_reply.py alone: a large reply's body, encoded in pieces, is JSONResponse's to the byte."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading

import pytest
from fastapi.responses import JSONResponse

from flotilla.engine.server.json_reply import (
    OFF_LOOP_VALUES,
    PIECE_VALUES,
    built,
    json_body,
    json_pieces,
    json_response,
    json_values,
)

SCALARS = [None, True, False, 0, -7, 12345678901234567890, 0.1, -9999.0, 1e300, "", "hello", "é\u2028\"\\\n", "🙂"]


def _random_value(rng: random.Random, depth: int) -> object:
    """Nested lists and dicts of every JSON scalar, some of them far larger than a piece."""
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(SCALARS)
    width = rng.choice([[0, 1, 3000, 9000], [0, 1, 3, 40], [0, 1, 3]][depth])
    if rng.random() < 0.5:
        return [_random_value(rng, depth + 1) for _ in range(width)]
    # keys of every kind json.dumps converts (numbers, booleans, None) besides strings
    return {rng.choice([f"k{i}", i, 2.5, True, None]): _random_value(rng, depth + 1) for i in range(width)}


def _logprob_reply(choices: int, tokens: int, top: int) -> dict:
    """A completions reply's shape: choices, each with per-token logprobs and prompt_logprobs."""
    entry = {str(t): {"logprob": -1.25 - t, "rank": t + 1, "decoded_token": f" tok{t}é"} for t in range(top)}
    return {"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": c, "text": "hello " * tokens, "logprobs": {
            "tokens": ["hello"] * tokens, "token_logprobs": [None] + [-0.5] * (tokens - 1),
            "top_logprobs": [None] + [{f"t{t}": -t / 3 for t in range(top)}] * (tokens - 1),
            "text_offset": list(range(tokens))},
         "prompt_logprobs": [None] + [entry] * (tokens - 1)} for c in range(choices)],
        "usage": {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}}


@pytest.mark.parametrize("seed", range(30))
def test_pieces_join_to_jsonresponses_body(seed):
    value = _random_value(random.Random(seed), 0)
    assert json_body(value) == JSONResponse(value).body


def test_a_large_reply_is_cut_into_pieces_of_bounded_size():
    reply = _logprob_reply(choices=8, tokens=300, top=20)
    assert json_values(reply, 10**9) > 40 * PIECE_VALUES
    pieces = list(json_pieces(reply))
    assert "".join(pieces).encode() == JSONResponse(reply).body
    # Every piece is one json.dumps of at most PIECE_VALUES values: none holds more than a piece's worth of entries
    biggest = max(len(piece) for piece in pieces)
    entry_chars = len(json.dumps(reply["choices"][0]["prompt_logprobs"][1], separators=(",", ":"))) / 20
    assert len(pieces) > 40 and biggest < PIECE_VALUES * entry_chars, (len(pieces), biggest)


def test_a_long_list_of_scalars_is_cut_too():
    ids = list(range(10 * PIECE_VALUES))
    pieces = list(json_pieces({"token_ids": ids}))
    assert len(pieces) > 10 and "".join(pieces) == json.dumps({"token_ids": ids}, separators=(",", ":"))


def test_a_wide_dict_of_scalars_is_cut_into_runs_not_one_piece_a_member():
    # A whole-vocabulary logprobs entry: one piece (and GIL hand-over) a member took ~10 s for 49k of them
    entry = {f" tok{t}": -t / 7 for t in range(10 * PIECE_VALUES)}
    entry.update({7: 0.5, True: None, None: "x", 2.5: [1, 2]})  # keys the encoder converts, as a whole dict's
    wide = {"top": entry, "big": {"k": list(range(2 * PIECE_VALUES)), "s": 1}}
    pieces = list(json_pieces(wide))
    assert "".join(pieces).encode() == JSONResponse(wide).body
    assert 10 < len(pieces) < 40, len(pieces)


def test_values_are_counted_only_up_to_the_limit():
    assert json_values(5, 10) == 1
    assert json_values({"a": [1, 2, {"b": None}]}, 100) == 6  # the dict, the list, 1, 2, the inner dict, None
    assert 10 < json_values([[0] * 1000] * 1000, 10) < 1100  # stopped once past the limit


@pytest.mark.parametrize("seed", range(20))
def test_a_value_past_the_limit_is_counted_past_it_at_every_depth(seed):
    # The count decides what is encoded whole: counted at the limit while past it, a Responses end's 2M values (its
    # message item six containers deep) were taken for 4,095 and encoded by one json.dumps holding the GIL 2.7 s
    rng = random.Random(seed)
    value: object = [rng.choice(SCALARS) for _ in range(rng.randrange(1, 5))]
    for _ in range(rng.randrange(1, 8)):  # nested, each level beside a few scalars
        value = rng.choice([lambda v: [v, *SCALARS[:rng.randrange(3)]], lambda v: {"k": v, "s": 0}])(value)
    total = json_values(value, 10**9)
    for limit in range(total + 2):
        counted = json_values(value, limit)
        assert counted == total if total <= limit else counted > limit, (limit, counted, total)


def test_a_small_reply_is_jsonresponse_and_a_large_one_has_its_bytes():
    small = {"choices": [{"text": "hi"}]}
    response = asyncio.run(json_response(small))
    assert type(response) is JSONResponse and response.body == JSONResponse(small).body
    large = _logprob_reply(choices=2, tokens=100, top=20)
    assert json_values(large, OFF_LOOP_VALUES) > OFF_LOOP_VALUES
    response = asyncio.run(json_response(large))
    assert response.body == JSONResponse(large).body and response.media_type == "application/json"
    assert response.headers["content-length"] == str(len(response.body))


def test_what_jsonresponse_refuses_is_refused():
    with pytest.raises(ValueError, match="JSON compliant"):
        json_body({"logprob": [math.nan] * (2 * PIECE_VALUES)})
    with pytest.raises(TypeError):
        json_body({"x": [object()] * (2 * PIECE_VALUES)})


def test_large_replies_leave_the_default_executors_threads_free():
    # Every request's body parse and tokenization run on asyncio's default executor (6 threads on 2 cores): large
    # replies blocked there would hold them all up. Forty large builds held at once leave it free.
    async def main() -> None:
        release = threading.Event()
        held = [asyncio.ensure_future(built(release.wait, OFF_LOOP_VALUES + 1)) for _ in range(40)]
        try:
            # A wait, not a timing bound: with the builds on the default executor this never came back
            assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 120) == 42
        finally:
            release.set()
            assert await asyncio.gather(*held) == [True] * 40

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(10))
def test_pieces_follow_the_encoders_separators(seed):
    # A stream's chunks are written with json's default separators (", ", ": ") and NaN allowed
    encoder = json.JSONEncoder(ensure_ascii=False)
    value = _random_value(random.Random(seed), 0)
    assert "".join(json_pieces(value, encoder)) == encoder.encode(value)


def test_a_streamed_choices_large_logprobs_are_encoded_in_pieces_as_json_text_writes_them():
    from flotilla.engine.server.sse import json_text, json_text_in_pieces

    logprobs = _logprob_reply(choices=1, tokens=2000, top=20)["choices"][0]["logprobs"]
    assert json_values(logprobs, 10**9) > 10 * PIECE_VALUES
    assert json_text_in_pieces(logprobs) == json_text(logprobs)


def test_a_responses_streams_large_closing_event_is_encoded_in_pieces_as_on_the_loop():
    # A Responses stream's end, built on a worker thread, encodes its events in pieces: the same bytes
    from flotilla.engine.server.responses import _Numbered

    logprobs = _logprob_reply(choices=1, tokens=2000, top=20)["choices"][0]["logprobs"]
    item = {"id": "msg_1", "type": "message", "content": [{"text": "é🙂", "logprobs": logprobs}]}
    assert json_values(item, 10**9) > 10 * PIECE_VALUES
    in_pieces, whole = _Numbered(), _Numbered()
    whole.next = in_pieces.next = 7
    pieces = list(in_pieces.pieces("response.output_item.done", output_index=0, item=item))
    assert len(pieces) > 10  # read a piece at a time: the event is never held whole before it is sent
    assert "".join(pieces) == whole("response.output_item.done", output_index=0, item=item)
    assert in_pieces.next == whole.next == 8


def test_a_responses_end_six_containers_deep_is_cut_into_pieces_of_bounded_size():
    # The closing event's logprobs as the server builds them: response > output > message > content > part >
    # logprobs > entry > top_logprobs; no piece holds more than a piece's worth of entries
    from flotilla.engine.server.responses import _Numbered

    entries = [{"token": f"t{i}", "logprob": -1.5, "bytes": (116, 49), "top_logprobs": [
        {"token": f"a{j}", "logprob": -2.5, "bytes": (97,)} for j in range(500)]} for i in range(40)]
    response = {"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": [
        {"type": "output_text", "text": "é", "annotations": [], "logprobs": entries}]}]}
    pieces = list(_Numbered().pieces("response.completed", response=response))
    entry_chars = len(json.dumps(entries[0]["top_logprobs"][0]))
    assert max(len(piece) for piece in pieces) < 2 * PIECE_VALUES * entry_chars / 3, max(map(len, pieces))
    assert "".join(pieces) == _Numbered()("response.completed", response=response)


def test_a_large_build_runs_with_garbage_collection_paused():
    # Each collection a build of millions of containers set off walked them all, holding the GIL (and so the loop)
    import gc

    assert asyncio.run(built(gc.isenabled, OFF_LOOP_VALUES + 1)) is False
    assert gc.isenabled()
    assert asyncio.run(built(gc.isenabled, OFF_LOOP_VALUES)) is True  # a small one, on the loop, leaves it alone



def test_the_event_loop_takes_the_gil_between_two_pieces_of_a_large_reply():
    # Each piece is one json.dumps: a C call holding the GIL, which the switch interval cannot cut. The event loop's
    # thread (after each epoll wait) and the engine-output thread (after each pipe read) waited for the interval
    # (5 ms) at every hand-off while a large reply was encoded. Here the interval is longer than the whole encoding,
    # so the loop's timer (every 0.2 ms) runs only where the encoder hands the GIL over itself: without the
    # hand-overs, at most around the encoding's start (0-2 ticks), never during it.
    import sys

    reply = _logprob_reply(choices=8, tokens=300, top=20)

    async def ticks_meanwhile() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        ticks = 0

        def tick() -> None:
            nonlocal ticks
            ticks += 1
            loop.call_later(0.0002, tick)

        loop.call_soon(tick)
        response = await json_response(reply)
        return ticks, len(response.body)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        ticks, size = asyncio.run(ticks_meanwhile())
    finally:
        sys.setswitchinterval(interval)
    assert size == len(JSONResponse(reply).body)
    assert ticks >= 10, ticks


@pytest.mark.parametrize("alternatives", [20, 1000])
def test_a_stream_steps_estimate_is_the_json_values_its_logprobs_make(embedded_model_dir, alternatives):
    """A stream step is built off the loop when `logprob_values` says it holds more than OFF_LOOP_VALUES values; it
    counted alternatives, each ~10 values in chat's chunk (token, logprob, bytes), so a step of 1,000 alternatives
    (10,769 values, 2.7 CPU ms) stayed on the event loop. The estimate is now within a factor 1.5 of the values."""
    from transformers import AutoTokenizer

    from flotilla.engine.outputs import CompletionOutput, RequestOutput
    from flotilla.engine.server.serving import OpenAIServing
    from flotilla.engine.server.sse import logprob_values

    serving = OpenAIServing(None, AutoTokenizer.from_pretrained(embedded_model_dir), 512, 49152)
    rng = random.Random(alternatives)
    ids = rng.sample(range(49152), alternatives + 1)
    entry = {token: (-rng.random() * 10, rank) for rank, token in enumerate(ids)}
    output = RequestOutput("r", None, [1, 2], outputs=[CompletionOutput(0, "x", [ids[0]], logprobs=[entry])])
    made = json_values(serving._chat_logprobs([ids[0]], [entry], alternatives), 10**9)
    assert made / 1.5 <= logprob_values(output) <= made * 1.5, (made, logprob_values(output))
    assert (logprob_values(output) > OFF_LOOP_VALUES) == (alternatives == 1000)

"""JSON replies too large for the event loop: built and encoded on a worker thread, the body in pieces.

A legal non-streamed request can ask for a reply of millions of values (n choices, each echoing a long prompt
with its logprobs and prompt_logprobs: 1.4M entries, a 125 MB body). Built on the event loop (Python) and encoded
there by Starlette's JSONResponse (one `json.dumps`: a single C call that holds the GIL), it held every stream,
/health and every other request for as long as both took (/health waited 8.5-15.6 s here; past a liveness
probe's timeout).

Here a reply of more than `OFF_LOOP_VALUES` JSON values is built (`built`) and encoded (`json_response`) on a
thread of its own (garbage collection paused meanwhile), and the encoding is cut into pieces of at most about
`PIECE_VALUES` values, one `json.dumps` each, and the thread hands the GIL over between two (`_gil_handed_over`):
the event loop's thread and the engine-output thread take it there instead of waiting for the switch interval at
each of their wake-ups. The bytes are JSONResponse's. A small reply (nearly every
one) is built and encoded on the loop as before: a thread hop costs more than its whole encoding.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, Response

from flotilla.engine.server.request_body import gc_paused

# A reply of more values than this is built and encoded on a worker thread (a few milliseconds of work on the
# loop; the thread hop, ~0.1 ms, is a few percent of that).
OFF_LOOP_VALUES = 4096

# The most values one `json.dumps` call of a large reply encodes (about 1-2 ms holding the GIL), unless a
# single container holds more scalars than this (such a list or dict is cut too).
PIECE_VALUES = 4096

# Starlette's JSONResponse encoding (its `render`, before the UTF-8 bytes).
REPLY_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))

_T = TypeVar("_T")
_CONTAINERS = (dict, list, tuple)


def json_values(content: Any, limit: int) -> int:
    """How many JSON values `content` holds (itself and, in its containers, every member at every depth),
    counted only until the count passes `limit`: a large reply costs no more to size than `limit` values."""
    if isinstance(content, dict):
        members: Any = content.values()
    elif isinstance(content, list | tuple):
        members = content
    else:
        return 1
    count = 1 + len(members)
    for member in members:
        if count > limit:
            break
        if isinstance(member, _CONTAINERS):
            # `count` holds the member once already: its own limit is what is left plus that one (with `limit -
            # count`, a member past its limit by one came back as exactly `limit`, read as small; one value lost at
            # each depth, a Responses end of 2M values was counted as 4,095 and encoded by one json.dumps of 2.7 s)
            count += json_values(member, limit - count + 1) - 1
    return count


# Large replies' own threads. On asyncio's default executor (`asyncio.to_thread`), a few large replies at once took
# every one of its threads (6 on 2 cores) for seconds, and the work every request hands it (its body's parse, its
# tokenization) waited behind them. Two: a reply's work is Python under the GIL, so more threads would not make
# replies faster, and a second keeps one very large reply from holding up the next.
_REPLY_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="json-reply")


async def off_the_loop(work: Callable[[], _T]) -> _T:
    """`work()` on one of the large replies' threads."""
    return await asyncio.get_running_loop().run_in_executor(_REPLY_THREADS, functools.partial(_without_gc, work))


def _without_gc(work: Callable[[], _T]) -> _T:
    """`work()` with garbage collection paused, as a large body's parse (`request_body.gc_paused`): a reply's
    build allocates its containers by the million, and each collection that set off walked them all in one C
    call holding the GIL (an in-process build of 670k entries: 0.88 s and a 0.1 s loop stall with collection,
    0.15 s and 6 ms without). What it builds is alive until sent: collecting meanwhile frees nothing."""
    with gc_paused():
        return work()


async def built(build: Callable[[], _T], values: int) -> _T:
    """`build()`, on a large replies' thread when what it builds holds more than `OFF_LOOP_VALUES` values
    (`values`: the caller's estimate, from the engine's outputs, before building)."""
    return await off_the_loop(build) if values > OFF_LOOP_VALUES else build()


async def json_response(content: Any) -> Response:
    """JSONResponse(content), its body encoded on a large replies' thread in pieces when `content` is large."""
    if json_values(content, OFF_LOOP_VALUES) <= OFF_LOOP_VALUES:
        return JSONResponse(content)
    body = await off_the_loop(functools.partial(json_body, content))
    return Response(body, media_type=JSONResponse.media_type)


def json_body(content: Any) -> bytes:
    """JSONResponse's body of `content`, encoded in pieces (blocking: call it on a worker thread)."""
    return b"".join(piece.encode("utf-8") for piece in json_pieces(content))


def json_pieces(value: Any, encoder: json.JSONEncoder | None = None) -> Iterator[str]:
    """The text `encoder` (JSONResponse's, `REPLY_ENCODER`, when None) writes for `value`, as consecutive pieces
    of at most about `PIECE_VALUES` values each: a container too large for one piece opens, its members follow
    (small ones batched into one piece, large ones cut in turn), and it closes. Between two pieces the GIL is
    handed over (`_gil_handed_over`): read them on a worker thread."""
    pieces = _pieces(value, encoder or REPLY_ENCODER)
    yield next(pieces)
    for piece in pieces:
        _gil_handed_over()
        yield piece


def _gil_handed_over() -> None:
    """Drop the GIL for a moment, so that a thread waiting for it can take it now. A piece is one C call
    (`json.dumps`) holding the GIL for 1-2 ms (5-10 ms on a loaded machine), which the switch interval cannot cut;
    then the thread ran Python, where a waiting thread took the GIL only once the interval (5 ms) was over. The
    event loop's thread waits so after each epoll wait, the engine-output thread after each pipe read: a 1 ms sleep
    beside the encoder woke 8.6-10.4 ms late (p50) without the hand-overs, 0.2-0.5 ms with them, the encoding as
    fast (bench/gil_handoff.py). A sleep of 0 is one system call with the GIL released."""
    time.sleep(0)


def _pieces(value: Any, encoder: json.JSONEncoder) -> Iterator[str]:
    """`json_pieces` without the hand-overs (recursive)."""
    if json_values(value, PIECE_VALUES) <= PIECE_VALUES:
        yield encoder.encode(value)
    else:
        opening, closing = "{}" if isinstance(value, dict) else "[]"
        yield opening
        yield from _members(value, encoder)
        yield closing


def _members(value: dict[Any, Any] | list[Any] | tuple[Any, ...], encoder: json.JSONEncoder) -> Iterator[str]:
    """A large dict's or list's members, separated: runs of small ones as one piece (one piece a member, with a GIL
    hand-over between two, made a whole-vocabulary logprobs entry of ~49k scalars take ~10 s), each large one cut
    (a dict's after its key)."""
    is_dict = isinstance(value, dict)
    pairs = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    run: list[tuple[Any, Any]] = []
    size = 0
    first = True
    for key, member in pairs:
        values = json_values(member, PIECE_VALUES) if isinstance(member, _CONTAINERS) else 1
        if run and (size + values > PIECE_VALUES or values > PIECE_VALUES):
            yield ("" if first else encoder.item_separator) + _encoded_run(run, is_dict, encoder)
            run, size, first = [], 0, False
        if values > PIECE_VALUES:
            yield ("" if first else encoder.item_separator) + (_key_text(key, encoder) if is_dict else "")
            yield from _pieces(member, encoder)
            first = False
        else:
            run.append((key, member))
            size += values
    if run:
        yield ("" if first else encoder.item_separator) + _encoded_run(run, is_dict, encoder)


def _encoded_run(run: list[tuple[Any, Any]], is_dict: bool, encoder: json.JSONEncoder) -> str:
    """A run of members as the encoder writes them inside their container (without its brackets)."""
    return encoder.encode(dict(run) if is_dict else [member for _, member in run])[1:-1]


def _key_text(key: Any, encoder: json.JSONEncoder) -> str:
    """A dict key as the encoder converts it (a number, a boolean, null), then its separator."""
    key_end = -len(encoder.key_separator) - 2  # after a key, in `{key: 0}`
    return encoder.encode({key: 0})[1:key_end] + encoder.key_separator

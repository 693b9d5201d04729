"""The big request of test_large_replies.py, made and read in a process of its own.

Run as a script (`python big_reply_reader.py`) with a JSON spec on stdin: {"url", "body", "api_key", "marker",
"out"}, and optionally "watch". It POSTs `body` to `url` streamed, writes the reply to the file `out` and tells its
parent on stdout, one line each, the stages it reaches with their time.monotonic() (system-wide on Linux, so the
parent can compare it with its own clock): "head <t> <status>" once the head is in, "marker <t>" once the reply
reaches `marker`:
- "head": its head (the reply is then read whole);
- "first-chunk": its body's first bytes (the reply is read in chunks);
- "line:TEXT": a line equal to TEXT (the reply is read line by line, as httpx parses SSE, and written one a line);
- "line-with:TEXT": the same, a line that holds TEXT (an event whose id and time cannot be known before).
With "watch": TEXT (a line marker's reading), "watched <t>" once a line holds TEXT: a stream's stage before the
marker, from which the tests time the others.
The tests' own requests are timed against the marker: read in the test's process, a reply of up to 118 MB of SSE
took that process's GIL from the threads that time them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

import httpx


def _tell(stage: str, *more: object) -> None:
    """Tell the parent that `stage` is reached now."""
    print(stage, time.monotonic(), *more, flush=True)


def _pieces(response: httpx.Response, marker: str, watch: str | None = None) -> Iterator[bytes]:
    """The reply's body in the pieces `marker` reads it in, telling the parent when the marker (and a line holding
    `watch`) is reached."""
    if marker == "head":
        yield response.read()
    elif marker == "first-chunk":
        for i, chunk in enumerate(response.iter_bytes()):
            if i == 0:
                _tell("marker")
            yield chunk
    else:
        kind, text = marker.split(":", 1)
        told = watched = False
        for line in response.iter_lines():
            if watch is not None and not watched and watch in line:
                _tell("watched")
                watched = True
            if not told and (text in line if kind == "line-with" else line == text):  # the first such line
                _tell("marker")
                told = True
            yield line.encode() + b"\n"


def _read(spec: dict, out: BinaryIO) -> None:
    """Make the spec's request, writing its reply to `out`."""
    headers = {"Authorization": f"Bearer {spec['api_key']}"}
    with httpx.stream("POST", spec["url"], json=spec["body"], headers=headers, timeout=600) as response:
        _tell("head", response.status_code)
        if spec["marker"] == "head":
            _tell("marker")
        for piece in _pieces(response, spec["marker"], spec.get("watch")):
            out.write(piece)


def main() -> None:
    """Read the spec from stdin and make its request."""
    spec = json.load(sys.stdin)
    with open(spec["out"], "wb") as out:
        _read(spec, out)


if __name__ == "__main__":
    main()

"""What a failed engine start may leave behind: its exception, and nothing that exception reaches.

A caller keeps the exception of a failed start (a notebook keeps the last one in `sys.last_value`,
`AsyncEngine.dead` keeps its own), and a traceback keeps every frame it passed through with their locals: the
half-built runner, its model, its KV pool. A retry in the same process (vLLM users lower
--gpu-memory-utilization and build again) would find that memory still held, and its free-memory check refuse.
"""

from __future__ import annotations

import traceback


def forget_frames(exc: BaseException) -> None:
    """Drop the locals of every finished frame in `exc`'s traceback and in those of its cause and context (the
    message, the types and the line numbers stay). Frames still running (the caller's) are left alone: the caller
    drops what it holds itself."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # a running frame raises RuntimeError there, which it skips
        pending += [error.__cause__, error.__context__]

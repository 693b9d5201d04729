"""Streaming text that a marker may interrupt (`</think>`, a tool call's opening tag): how much of it is surely not
the start of the marker yet."""

from __future__ import annotations


def safe_len(text: str, marker: str) -> int:
    """Length of `text` without a tail that is a proper prefix of `marker` (`len(text)` when there is none)."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)

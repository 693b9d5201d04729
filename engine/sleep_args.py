"""What a sleep and a wake-up may be asked (sleep mode, engine/sleep_mode.py): vLLM's levels, pause modes and memory
tags, checked by the engine (offline calls too) and by the server's routes before they reach it (this module needs no
torch: the API process imports it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

SleepTag = Literal["weights", "kv_cache"]
# What wake_up(tags=...) may name (vLLM's memory tags; "scheduling" is level 0's: no memory, see LLMEngine.wake_up).
SLEEP_TAGS: tuple[SleepTag, ...] = ("weights", "kv_cache")


def check_sleep_level(level: int) -> None:
    """ValueError unless `level` is one of vLLM's: 0 (pause scheduling only), 1 or 2."""
    if isinstance(level, bool) or not isinstance(level, int) or level not in (0, 1, 2):
        raise ValueError(f"sleep level must be 0, 1 or 2, not {level!r}")


SleepMode = Literal["abort", "wait", "keep"]
# vLLM's pause modes, what a sleep does with the requests in flight: end them (abort, the default: finish_reason
# "abort"), let the running ones finish first (wait), or hold them, preempted, until the wake-up (keep).
SLEEP_MODES: tuple[SleepMode, ...] = ("abort", "wait", "keep")


def check_sleep_mode(mode: str) -> None:
    """ValueError unless `mode` is one of vLLM's: abort, wait or keep."""
    if mode not in SLEEP_MODES:
        raise ValueError(f"sleep mode must be 'abort', 'wait' or 'keep', not {mode!r}")


def wake_tags(tags: Iterable[str] | None) -> tuple[str, ...]:
    """The tags a wake_up names (all of SLEEP_TAGS for None); ValueError names an unknown one."""
    if tags is None:
        return (*SLEEP_TAGS, "scheduling")
    tags = tuple(tags)
    unknown = [t for t in tags if t not in (*SLEEP_TAGS, "scheduling")]
    if unknown:
        raise ValueError(f"unknown wake_up tag(s) {', '.join(map(repr, unknown))}: use weights, kv_cache or "
                         "scheduling")
    return tags

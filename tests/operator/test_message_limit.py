"""The bound on one message the operator writes (operator/message_limit.py)."""

from __future__ import annotations

import pytest

from flotilla.operator.message_limit import MESSAGE_LIMIT, clip, join_errors


def test_errors_that_fit_are_joined_whole():
    assert join_errors(["a: bad", "b: worse"]) == "a: bad; b: worse"


def test_many_errors_show_the_first_whole_ones_and_count_the_rest():
    errors = [f"spec.pod.labels: key{i:05d} " + "x" * 300 for i in range(20_000)]
    message = join_errors(errors)
    assert len(message.encode()) <= MESSAGE_LIMIT
    shown, note = message.rsplit("; ", 1)
    parts = shown.split("; ")
    assert parts == errors[:len(parts)] and len(parts) > 10  # whole errors, in order
    assert note == f"and {20_000 - len(parts)} more (20000 errors in all, the first shown)"


@pytest.mark.parametrize("size", range(1, 40))
def test_the_joined_errors_and_their_note_stay_within_the_limit_to_the_byte(size):
    # Every error length against a small limit: some shown errors end exactly at the limit, and the '; ' before
    # the note must be counted with them.
    limit = 200
    message = join_errors(["x" * size] * 100, limit)
    assert len(message.encode()) <= limit
    assert message.endswith(" errors in all, the first shown)")


def test_a_first_error_too_long_alone_is_cut_within_the_limit():
    message = join_errors(["é" * 20_000, "b"])  # two bytes a character: the cut keeps whole characters
    assert len(message.encode()) <= MESSAGE_LIMIT
    assert message.startswith("éé") and "… (40000 bytes in all); and 1 more (2 errors in all" in message


def test_clip_keeps_short_messages_and_says_how_long_a_long_one_was():
    assert clip("short") == "short"
    clipped = clip("a" * 100_000)
    assert len(clipped.encode()) <= MESSAGE_LIMIT and clipped.endswith("… (100000 bytes in all)")

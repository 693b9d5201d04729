"""How much one message the operator writes may say: a refusal, a condition, the reason a child was not applied.

A spec's refusal grows with the spec: one error per refused key, each explaining why (300 characters for a pod
annotation with a dot), so 20 000 such keys, a 300 kB spec, made a 6 MB refusal. The apiserver takes no status
write that large (it closes the connection, which reads as an outage), so that InferenceService never got a
condition or an Event and was retried for ever, each retry building and sending megabytes again. The webhook's
answer, the Valid and Ready conditions, kopf's record of a handler's failure (an annotation, at most 256 KiB with all
the others) and an apiserver refusal quoted in Degraded all carry such a message, so each is bounded here.
"""

from __future__ import annotations

# Bytes (UTF-8) of one message: several whole errors' worth, far below what a status write or an annotation holds.
MESSAGE_LIMIT = 8192
ELLIPSIS = "…"


def clip(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message`, or its first bytes and how long it was, within `limit` bytes of UTF-8."""
    encoded = message.encode()
    if len(encoded) <= limit:
        return message
    tail = f"{ELLIPSIS} ({len(encoded)} bytes in all)"
    kept = encoded[:max(limit - len(tail.encode()), 0)].decode(errors="ignore")  # never half a character
    return kept + tail


def join_errors(errors: list[str], limit: int = MESSAGE_LIMIT) -> str:
    """The errors joined with '; ', as many whole ones as fit in `limit` bytes with a note of how many more there
    are; the first one cut to fit when it alone does not."""
    joined = "; ".join(errors)
    if len(joined.encode()) <= limit:
        return joined
    shown: list[str] = []
    size = 0
    for error in errors:
        note = _more(len(errors) - len(shown) - 1, len(errors))
        grown = size + len(error.encode()) + (2 if shown else 0)
        if grown + 2 + len(note.encode()) > limit:  # the "; " before the note counts too
            break
        shown.append(error)
        size = grown
    if not shown:  # the first error alone is too long: its beginning, then the note
        note = _more(len(errors) - 1, len(errors))
        return clip(errors[0], limit - len(note.encode()) - 2) + "; " + note
    return "; ".join(shown) + "; " + _more(len(errors) - len(shown), len(errors))


def _more(more: int, total: int) -> str:
    return f"and {more} more ({total} errors in all, the first shown)"

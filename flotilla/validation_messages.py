"""pydantic's validation errors in the user's words, written once for every component.

Takes the plain list that `ValidationError.errors()` returns (so this module needs no pydantic):
each error becomes `<where>: <message>`, with pydantic's "Value error, " prefix dropped and `where`
named by the caller's function (a CLI flag for the engine, a spec path for the operator, a JSON
field for the server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Location = Sequence[Any]


def dotted(loc: Location) -> str:
    """`("scheduling", "maxModelLen")` -> `scheduling.maxModelLen`; list indices as `[0]`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(errors: Iterable[Mapping[str, Any]], where: Callable[[Location], str] = dotted) -> list[str]:
    """One `where: message` per error (just the message when `where` gives an empty name)."""
    parts = []
    for err in errors:
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        name = where(tuple(err.get("loc", ())))
        parts.append(f"{name}: {message}" if name else message)
    return parts

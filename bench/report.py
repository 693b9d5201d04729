"""How a benchmark hands over its result: one JSON document, printed and, with --json, saved."""

from __future__ import annotations

import json
from typing import Any


def report(result: dict[str, Any], path: str | None, *, echo: bool = True) -> None:
    """Print `result` as indented JSON (unless `echo` is off) and write it to `path` when given."""
    text = json.dumps(result, indent=2)
    if echo:
        print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)

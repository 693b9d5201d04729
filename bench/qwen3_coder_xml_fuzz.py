"""Differential fuzz of the qwen3_coder XML helpers: the working tree's against a git revision's, on random texts.

Each text is built from the format's pieces (`<tool_call>`, `<function=NAME>`, `<parameter=NAME>`, their closers,
newlines, spaces, text, names of the schema and others). For each of the schemas (none, {a}, {a, b}) it compares the
whole reading (every block, its function, body and parameters) and, at every position after a `>` or a newline and at
a few random ones, where a value starting there ends (both with and without the body's end as an end). It prints the
number of texts and of comparisons, and the first difference (exit 1) if any.

    .venv/bin/python bench/qwen3_coder_xml_fuzz.py [--texts 100000] [--rev 25779ef7] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import types
from typing import Any

from flotilla.engine.server.tool_parsers import qwen3_coder_xml as new

PATH = "engine/server/tool_parsers/qwen3_coder_xml.py"
PIECES = ["<tool_call>", "</tool_call>", "<function=f>", "<function=a>", "</function>", "<parameter=a>",
          "<parameter=b>", "<parameter=c>", "<parameter=", "</parameter>", "\n", "\n", "\n", " ", "x", "ab", ">", "<",
          "</parameter>\n", "\n<parameter=a>\n", "\n<parameter=zz>\n", "\n</function>", "\n</tool_call>"]
SCHEMAS: list[set[str] | None] = [None, {"a"}, {"a", "b"}]


def old_module(rev: str) -> Any:
    """The helpers as `rev` has them."""
    module = types.ModuleType("qwen3_coder_xml_old")
    exec(subprocess.run(["git", "show", f"{rev}:{PATH}"], capture_output=True, text=True, check=True).stdout,
         module.__dict__)
    return module


def reading(xml: Any, text: str, names: set[str] | None) -> list[Any]:
    """Everything the helpers make of `text`: per block, its function's name, body and parameters."""
    out: list[Any] = []
    for block in xml.call_blocks(text):
        opened = xml.function_open(block)
        if opened is None:
            out.append((block, None))
            continue
        body = xml.function_body(opened[1], names)
        out.append((block, opened[0], body, list(xml.parameters(body, names))))
    return out


def old_end(old: Any, text: str, start: int, names: set[str] | None, at_body_end: bool) -> int:
    """Where the revision's helpers end a value starting at `start` (its _value_end, by whichever signature)."""
    if hasattr(old, "_closers"):
        return int(old._value_end(text, start, names, old._closers(text), at_body_end=at_body_end))
    return int(old._value_end(text, start, names, at_body_end=at_body_end))


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--texts", type=int, default=100_000)
    args.add_argument("--rev", default="25779ef7")
    args.add_argument("--seed", type=int, default=0)
    opts = args.parse_args()
    old, rng, compared = old_module(opts.rev), random.Random(opts.seed), 0
    for _ in range(opts.texts):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40)))
        starts = {i + 1 for i, c in enumerate(text) if c in ">\n"} | {rng.randint(0, len(text)) for _ in range(3)}
        for names in SCHEMAS:
            if reading(old, text, names) != reading(new, text, names):
                print(f"reading differs: names={names} text={text!r}")
                return 1
            for at_body_end in (False, True):
                ends = new._ValueEnds(text, names, at_body_end)
                for start in starts:
                    if old_end(old, text, start, names, at_body_end) != ends.end(start):
                        print(f"value end differs: start={start} names={names} {at_body_end=} text={text!r}")
                        return 1
                    compared += 1
    print(f"{opts.texts} texts, {compared} value ends and {opts.texts * len(SCHEMAS)} readings: no difference")
    return 0


if __name__ == "__main__":
    sys.exit(main())

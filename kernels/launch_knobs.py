"""Launch-knob strings: the one syntax of the kernels' measured tables and of the variables that override them.

A knob list is `name=value` pairs, `,`-separated, any subset (`bn=16,bk=512,w=4`): each name stands for a launch
keyword (`bn` -> `block_n`), each value is a non-negative integer. A table is `;`-separated entries `NxK:knobs`, one
`[N, K]` weight shape's knobs, or a bare `knobs` entry for every shape where the variable has one (key None).
Whitespace around any part is ignored. FLOTILLA_GEMV_CONFIG, FLOTILLA_FP8_ROW_GEMV_CONFIG, FLOTILLA_GATED_GEMV_CONFIG,
FLOTILLA_LM_HEAD_GEMV, the int4 GEMVs' tile variables and the knobs of FLOTILLA_SKINNY_GEMM_CONFIGS are all read here;
what differs between them is a `KnobSyntax`: the names, the values each knob may take, whether an every-shape entry
exists. A bad string is a ValueError naming the variable (what a user set), never a knob silently dropped.

Pure string work (no torch, no Triton): `dispatch` reads the LM head's variable on the CPU path too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

Table = dict[tuple[int, int] | None, dict[str, int]]
_UNBOUNDED = 1 << 62
ANY = range(0, _UNBOUNDED)  # every non-negative integer
POSITIVE = range(1, _UNBOUNDED)


def _parts(text: str, sep: str) -> Iterator[str]:
    """The non-empty, stripped pieces of `text` between `sep`s."""
    return (p.strip() for p in text.split(sep) if p.strip())


def _describe(values: range) -> str:
    if values == range(2):
        return "0 or 1"
    if values.stop >= _UNBOUNDED:
        return f">= {values.start}" if values.start else ""
    return f"{values.start}..{values.stop - 1}"


def parse_shape(variable: str, shape: str, entry: str = "NxK:knobs, e.g. 4096x4096:bn=8") -> tuple[int, int]:
    """`"NxK"` as `(N, K)`; a ValueError naming `variable` and the `entry` it expects for anything else."""
    n, _, k = shape.partition("x")
    if not (n.strip().isdigit() and k.strip().isdigit()):
        raise ValueError(f"{variable}: bad shape {shape!r} (expected {entry})")
    return int(n), int(k)


@dataclasses.dataclass(frozen=True)
class KnobSyntax:
    """One variable's knobs: `names` maps a knob's spelling to its launch keyword (in the order `spec` prints);
    `values` are the integers every knob takes, `ranges` a knob's own where it differs (a 0/1 switch among sizes);
    `shapeless`: a table may hold a bare every-shape entry."""

    variable: str
    names: Mapping[str, str]
    values: range = ANY
    ranges: Mapping[str, range] = dataclasses.field(default_factory=dict)
    shapeless: bool = False

    def expected(self) -> str:
        """What a knob list may hold, as the errors say it."""
        names = ", ".join(f"{n}=" for n in self.names if n not in self.ranges)
        own = "".join(f"; {n}= {_describe(r)}" for n, r in self.ranges.items())
        return f"{names} integers {_describe(self.values)}".rstrip() + own

    def knobs(self, text: str) -> dict[str, int]:
        """A knob list as `{keyword: value}`; the last of a repeated knob wins."""
        out = {}
        for item in _parts(text, ","):
            name, _, value = (t.strip() for t in item.partition("="))
            if not (name in self.names and value.isdigit() and int(value) in self.ranges.get(name, self.values)):
                raise ValueError(f"{self.variable}: bad knob {item!r} (expected {self.expected()})")
            out[self.names[name]] = int(value)
        return out

    def table(self, text: str) -> Table:
        """A table as `{(N, K) or None: knobs}`. An entry without knobs says nothing and is left out: a shape's
        entry wins whole where a kernel looks one up (the int4 GEMVs), so an empty one would hide the bare entry."""
        out: Table = {}
        for entry in _parts(text, ";"):
            shape, colon, knobs = entry.rpartition(":")
            key = None if not colon and self.shapeless else parse_shape(self.variable, shape)
            values = self.knobs(knobs)
            if values:
                out[key] = values
        return out

    def spec(self, knobs: Mapping[str, int]) -> str:
        """`{keyword: value}` as the knob list `knobs` reads (in `names`' order; keywords it lacks left out)."""
        return ",".join(f"{name}={int(knobs[key])}" for name, key in self.names.items() if key in knobs)

    def table_spec(self, table: Table) -> str:
        """A table as the string `table` reads."""
        return ";".join((f"{key[0]}x{key[1]}:" if key else "") + self.spec(knobs) for key, knobs in table.items())


__all__ = ["ANY", "POSITIVE", "KnobSyntax", "Table", "parse_shape"]

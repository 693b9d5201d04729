"""Environment switches: a FLOTILLA_* variable read as one of a fixed set of values.

A switch that silently falls back on its default for a value it does not know turns a typo
(FLOTILLA_SKINNY_GEMM=off, FLOTILLA_PDL=false) into a benchmark of the wrong configuration, which
costs a device call to notice. These readers raise instead, naming the variable and the values it
accepts. Unset or empty (after stripping) always means the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")
D = TypeVar("D")

# Spellings of an on/off switch (matched lower-cased). "0" and "1" are what the scripts and docs use;
# the words are accepted so that "false" cannot mean "on" (the old `!= "0"` tests read it so).
FLAG_VALUES: Mapping[str, bool] = {
    "0": False, "false": False, "off": False, "no": False,
    "1": True, "true": True, "on": True, "yes": True,
}  # fmt: skip


def parse_choice(name: str, value: str, choices: Mapping[str, T], default: D) -> T | D:
    """`choices[value]` for the (stripped) `value` of variable `name`, `default` when it is empty; a
    ValueError naming `name` and the accepted values for anything else."""
    key = value.strip()
    if not key:
        return default
    if key not in choices:
        accepted = ", ".join(repr(k) for k in choices)
        raise ValueError(f"{name}={value!r}: expected one of {accepted} (or unset)")
    return choices[key]


def env_choice(name: str, choices: Mapping[str, T], default: D) -> T | D:
    """The environment variable `name` read by `parse_choice`."""
    return parse_choice(name, os.environ.get(name, ""), choices, default)


def env_flag(name: str, default: D) -> bool | D:
    """The on/off environment variable `name` ("0"/"1", or false/true, off/on, no/yes in any case);
    `default` when unset or empty."""
    return parse_choice(name, os.environ.get(name, "").lower(), FLAG_VALUES, default)

"""Command-line flags for the engine, built from the one flag declaration (`flotilla.flags`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flotilla.dotted_args import expand_dotted_args, object_options
from flotilla.engine.config import ENGINE_COMPONENTS
from flotilla.flags import FLAGS, Flag, human_readable_int, json_value
from flotilla.removed_flags import removed_flag_problem
from flotilla.underscore_flags import dashed_names

__all__ = ["ENGINE_COMPONENTS", "FlagParser", "add_flags", "flag_values"]

_TYPES = {"str": str, "int": int, "float": float, "json": json_value}


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that reads the command line as `vllm serve` does where argparse alone would not: a flag's
    name with underscores (`--max_model_len`, flotilla/underscore_flags.py), the dotted keys of a JSON-object flag
    (flotilla/dotted_args.py), and flags vLLM removed, refused saying so (flotilla/removed_flags.py)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]  # typeshed overloads it by namespace type
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """argparse's parse, after the underscore names are dashed and the dotted forms are written as the JSON
        object they stand for."""
        argv = dashed_names(list(sys.argv[1:] if args is None else args))
        if problem := removed_flag_problem(argv):
            self.error(problem)
        try:
            argv = expand_dotted_args(argv, object_options(self))
        except ValueError as exc:
            self.error(str(exc))
        return super().parse_known_args(argv, namespace)


def add_flags(parser: argparse.ArgumentParser, components: Iterable[str]) -> None:
    """Add every declared flag of `components`; unset flags stay absent from the parsed namespace."""
    wanted = set(components)
    group = parser.add_argument_group("engine")
    for f in FLAGS:
        if f.component in wanted:
            group.add_argument(*f.aliases, f.name, dest=f.dest, default=argparse.SUPPRESS, help=_help(f), **_kind(f))


def _kind(f: Flag) -> dict[str, Any]:
    if f.type == "bool":
        return {"action": argparse.BooleanOptionalAction if f.negatable else "store_true"}
    if f.type == "list":
        return {"nargs": "+"}
    kind: dict[str, Any] = {"type": _human_int(f.name) if f.human_readable else _TYPES[f.type]}
    if f.choices is not None:
        kind["choices"] = f.choices
    return kind


def _human_int(name: str) -> Callable[[str], int]:
    """argparse's type for the human-readable int flag `name` (its refusals name that flag's own rules)."""
    def parse(text: str) -> int:
        try:
            return human_readable_int(text, name)
        except ValueError as exc:  # argparse shows an ArgumentTypeError's own words
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _help(f: Flag) -> str:
    text = f"{f.help} (default: {f.default})"
    if f.human_readable:
        text += "; also as vLLM's 32k (32,000) or 32K (32,768)"
    if f.env:
        text += f" [env {f.env}]"
    if not f.implemented:
        text += " [not implemented yet]"
    return text


def flag_values(args: argparse.Namespace, components: Iterable[str]) -> dict[str, Any]:
    """The flags the user set (on the command line or through their environment variable)."""
    wanted = set(components)
    values: dict[str, Any] = {}
    for f in FLAGS:
        if f.component not in wanted:
            continue
        if hasattr(args, f.dest):
            values[f.dest] = getattr(args, f.dest)
        elif f.env and f.env in os.environ:
            # Set-but-empty counts as set: an empty VLLM_API_KEY must reach validation (and be
            # refused) rather than silently mean "no key".
            values[f.dest] = os.environ[f.env]
    return values


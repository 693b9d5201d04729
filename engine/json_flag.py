"""Flags whose value is a JSON object (`--speculative-config`, `--structured-outputs-config`), as vLLM
takes them: JSON text on the command line or a dict from the Python API, validated by a pydantic model,
with errors that name the flag and the key."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from flotilla.flags import json_value

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def parse_json_flag(value: str | dict[str, Any], flag: str, model: type[ConfigT]) -> ConfigT:
    """`value` (JSON text or a dict) as a `model`; ValueError naming `flag` and each bad key otherwise."""
    if isinstance(value, str):
        try:
            value = json_value(value)
        except ValueError as exc:  # bad JSON, or nested too deeply (flags.json_value)
            raise ValueError(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object")
    try:
        return model(**value)
    except ValidationError as exc:
        problems = "; ".join(_describe(e["loc"], str(e["msg"])) for e in exc.errors())
        raise ValueError(f"{flag}: {problems}") from None


def _describe(loc: tuple[int | str, ...], msg: str) -> str:
    where = ".".join(str(x) for x in loc)
    return (f"{where}: " if where else "") + msg.removeprefix("Value error, ")

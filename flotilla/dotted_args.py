"""vLLM's dotted forms of a JSON-object flag: `--compilation-config.cudagraph_mode FULL`,
`-cc.cudagraph_capture_sizes '[1,2,4]'`, `--hf-overrides.rope_scaling.factor=4`, `--speculative-config.method ngram`
(vLLM's FlexibleArgumentParser, vllm/utils/argparse_utils.py).

As vLLM reads them: the part after the flag's name is a path of keys (`a.b.c` nests objects); the value follows as
the next token or after `=`, and is JSON where it parses as JSON, else a human-readable integer (`80k`), else the text
itself; `key+ v1,v2` is a list, and the dotted keys of one flag merge into one object (a later key wins, two lists
are joined, as vLLM's merge). `-O.key` is `--compilation-config.key`, as vLLM's debugging guide writes it (-O was
--compilation-config's alias before it became the optimization level; vLLM's parser now reads `-O.mode` as a level
and refuses it).

Standard library only (and the flag declaration): the operator expands spec.engineArgs with it, as the engine's
parser does. Unlike vLLM, a dotted key on a flag that takes no JSON object (`--port.x`, `--allowed-origins.x`) is a
usage error naming the flag, and so are a flag's JSON value and its dotted keys together: vLLM keeps the dotted keys
alone and drops the JSON value's keys without a word.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from flotilla.flags import FLAGS, human_readable_int, json_value
from flotilla.underscore_flags import dashed_name

# The flags whose value is a JSON object (a JSON list flag, such as --allowed-origins, takes no keys).
OBJECT_FLAGS = {f.dest for f in FLAGS if f.type == "json" and not isinstance(f.default, list)}
# vLLM's older spelling: -O was --compilation-config, so `-O.mode 3` is its key
OLD_ALIASES = {"-O": "--compilation-config"}
_OPTION = re.compile(r"-{1,2}[A-Za-z]")


def flag_options() -> dict[str, str]:
    """Each option string of the declared flags -> the flag's long name, for the JSON-object flags ("" for the rest):
    what `expand_dotted_args` takes where there is no parser (the operator's check of spec.engineArgs)."""
    options = {}
    for f in FLAGS:
        negated = ("--no-" + f.name[2:],) if f.negatable else ()
        for option in (f.name, *f.aliases, *negated):
            options[option] = f.name if f.dest in OBJECT_FLAGS else ""
    return options


def object_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option string of `parser` -> the flag's long name, for the JSON-object flags ("" for the rest)."""
    return {option: (action.option_strings[-1] if action.dest in OBJECT_FLAGS else "")
            for option, action in parser._option_string_actions.items()}


def expand_dotted_args(argv: list[str], options: dict[str, str]) -> list[str]:
    """`argv` with each flag's dotted keys gathered into one `FLAG JSON` pair at the end (where vLLM puts them).
    `options`: every option string -> the JSON-object flag's long name, "" for other flags. ValueError naming the
    flag for a dotted key it cannot take."""
    rest: list[str] = []
    objects: dict[str, dict[str, Any]] = {}
    tokens = iter(argv)
    for token in tokens:
        name, has_value, text = token.partition("=")
        base, dot, path = name.partition(".")
        if not dot or not _OPTION.match(token):  # a plain flag, or a value such as -0.5
            rest.append(token)
            continue
        flag = _object_flag(OLD_ALIASES.get(base, base), options)
        if not has_value:
            following = next(tokens, None)
            if following is None:
                raise ValueError(f"{name}: expected a value")
            text = following
        keys = path.split(".")
        if not all(keys):
            raise ValueError(f"{name}: an empty key")
        _merge(objects.setdefault(flag, {}), _nested(keys, text))
    for flag in objects:
        if given := [t for t in rest if t.partition("=")[0] in _spellings(flag, options)]:
            raise ValueError(f"{flag} is given both as a JSON value ({given[0]}) and as dotted keys: give one form "
                             "(vLLM would keep the dotted keys alone and drop the value's)")
    return rest + [item for flag, value in objects.items() for item in (flag, json.dumps(value))]


def _object_flag(base: str, options: dict[str, str]) -> str:
    """The long name of the JSON-object flag `base` spells (`-cc`, `--hf_overrides`); ValueError otherwise."""
    spelled = base if base in options else dashed_name(base)
    if spelled not in options:
        raise ValueError(f"{base}: no such flag (a dotted key follows a JSON flag's name: "
                         f"--compilation-config.cudagraph_mode FULL)")
    if not options[spelled]:
        raise ValueError(f"{spelled} takes no dotted keys: only a flag whose value is a JSON object does "
                         f"({', '.join(sorted({v for v in options.values() if v}))})")
    return options[spelled]


def _spellings(flag: str, options: dict[str, str]) -> set[str]:
    return {option for option, long_name in options.items() if long_name == flag}


def _nested(keys: list[str], text: str) -> dict[str, Any]:
    """{"a": {"b": value}} for keys a, b+ ... with `text` read as vLLM reads a dotted value."""
    *outer, last = keys
    value = [_value(item) for item in text.split(",")] if last.endswith("+") else _value(text)
    nested: dict[str, Any] = {last.removesuffix("+"): value}
    for key in reversed(outer):
        nested = {key: nested}
    return nested


def _value(text: str) -> Any:
    """JSON where `text` parses as JSON, else a human-readable integer (`80k`), else the text itself."""
    try:
        return json_value(text)
    except json.JSONDecodeError:  # not JSON: a number or text (too deep a JSON stays a ValueError)
        pass
    try:
        return human_readable_int(text, "a dotted key")
    except ValueError:
        return text


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's merge of one flag's dotted keys: objects merge key by key, two lists are joined, a later value wins."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value

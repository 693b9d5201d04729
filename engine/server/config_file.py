"""`flotilla serve --config FILE`: vLLM's YAML file of flags, read as the command line it stands for.

As in vLLM: each key is a flag's long name without its leading dashes (`max-model-len`, or `max_model_len` as
flotilla/underscore_flags.py reads it), a value true sets a boolean flag, a list gives a list flag its values, a
mapping is a JSON flag's object (`hf-overrides: {rope_theta: 1e6}`, nested as deep as the object is), a dotted key is
the dotted form of a JSON-object flag (`compilation-config.mode: 3`, as `--compilation-config.mode 3`;
flotilla/dotted_args.py), and a flag given on the command line wins over the file's (command line > file > defaults;
the file's `model` is served only when the command line names none). Unlike vLLM, a key that is not a flag here,
or a value of the wrong shape, is a usage error naming the key, rather than whatever argparse makes of the generated
tokens; and a dotted key's list or true is given as JSON (`compilation-config.cudagraph_capture_sizes: [1, 2]`,
`hf-overrides.is_matryoshka: true`), where vLLM's tokens would lose the list's later items or the true.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

import yaml

from flotilla.engine.arg_parser import FlagParser
from flotilla.flags import CONFIG_FLAG, FLAGS, MODEL_FLAG, Flag
from flotilla.underscore_flags import dashed_name


class ConfigFileError(ValueError):
    """A --config file that cannot be read as flags (the message names the file and, where one is at fault, the
    key)."""


class ConfigFileParser(FlagParser):
    """The server's parser for a config file's flags: its usage errors raise ConfigFileError instead of exiting,
    so that the caller can name the file."""

    def error(self, message: str) -> NoReturn:
        """Raise the usage error for the caller to report."""
        raise ConfigFileError(message)


def apply_config_file(args: argparse.Namespace, file_parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`args` with the flags of its --config file added where the command line did not set them (flags the
    command line leaves out are absent from `args`: their defaults are argparse.SUPPRESS). ConfigFileError when
    the file cannot be read, is not a mapping of flags, or holds a value its flag refuses."""
    path = args.config
    argv = config_file_argv(path)
    try:
        from_file = file_parser.parse_args(argv)
    except ConfigFileError as exc:
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: {exc}") from None
    merged = argparse.Namespace(**vars(from_file))
    for dest, value in vars(args).items():
        if value is not None or not hasattr(merged, dest):
            setattr(merged, dest, value)
    if args.model is not None or args.model_option is not None:  # the command line's MODEL wins over the file's
        merged.model, merged.model_option = args.model, args.model_option
    return merged


def config_file_argv(path: str) -> list[str]:
    """The command-line tokens the YAML file at `path` stands for (ConfigFileError when it cannot be read or is
    not a mapping of this server's flags)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: cannot be read ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: is not YAML ({_first_line(exc)})") from None
    if data is None:
        return []  # an empty file (or only comments): no flags
    if not isinstance(data, dict):
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: must be a mapping of flag names to values "
                              f"(`max-model-len: 4096`), not a {type(data).__name__}")
    argv: list[str] = []
    for key, value in data.items():
        try:
            argv += _tokens(key, value)
        except ValueError as exc:
            raise ConfigFileError(f"{CONFIG_FLAG} {path}: {exc}") from None
    return argv


_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}


def _tokens(key: Any, value: Any) -> list[str]:
    """One key's command-line tokens; ValueError naming the key when it is no flag or its value has the wrong
    shape."""
    if not isinstance(key, str):
        raise ValueError(f"key {key!r} is not a flag name")
    name, dot, keys = dashed_name("--" + key.lstrip("-")).partition(".")
    if dot:
        return _dotted_tokens(key, name, keys, value)
    if name == MODEL_FLAG:
        return [MODEL_FLAG, _scalar(key, value)]
    if name == CONFIG_FLAG:
        raise ValueError(f"key {key!r}: a config file cannot name another one")
    f = _BY_NAME.get(name)
    if f is None:
        raise ValueError(f"key {key!r} is not a flag of flotilla serve (see `flotilla serve --help`)")
    if f.type == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"key {key!r} is a boolean flag: give true or false, not {value!r}")
        if value:
            return [name]
        return [f"--no-{name[2:]}"] if f.negatable else []  # false: the flag's default (False) stays
    if f.type == "json" and isinstance(value, (dict, list)):
        return [name, json.dumps(value)]
    if f.type == "list":
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError(f"key {key!r} takes one value or more, not an empty list")
        return [name, *(_scalar(key, item) for item in items)]
    return [name, _scalar(key, value)]


def _dotted_tokens(key: str, name: str, keys: str, value: Any) -> list[str]:
    """A dotted key's tokens (`--compilation-config.mode`, then its value): the engine's parser gathers them
    into the flag's object, and refuses a key of a flag that takes none (ValueError here for a name that is no flag)."""
    if name not in _BY_NAME:
        raise ValueError(f"key {key!r} is not a flag of flotilla serve (a dotted key follows a JSON flag's name: "
                         "`compilation-config.mode: 3`)")
    # text as vLLM passes it (JSON where it parses, `80k` a human-readable integer), the rest as its JSON
    return [f"{name}.{keys}", value if isinstance(value, str) else json.dumps(value)]


def _scalar(key: str, value: Any) -> str:
    """A single value as the command line writes it; ValueError for none, a list or a mapping."""
    if value is None or isinstance(value, (dict, list)):
        raise ValueError(f"key {key!r} takes a single value, not {value!r}")
    if isinstance(value, bool):  # YAML's true for a str or number flag: the command line's word
        return str(value).lower()
    return str(value)


def _first_line(exc: Exception) -> str:
    """A YAML error in a line: its problem and where (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    return f"{problem}, line {mark.line + 1} column {mark.column + 1}" if mark is not None else problem

"""The --hf-overrides value an InferenceService's engineArgs carry, read as the engine's parser reads it."""

from __future__ import annotations

from typing import Any

from flotilla.dotted_args import expand_dotted_args, flag_options
from flotilla.engine_rules import parse_argv
from flotilla.underscore_flags import dashed_names


def engine_args_hf_overrides(engine_args: list[str]) -> Any:
    """The value of --hf-overrides in `engine_args` as the engine's parser reads it (underscore names, dotted keys),
    or None where it is not given or the flags cannot be read (the webhook refuses those; engine_args.py)."""
    try:
        argv = expand_dotted_args(dashed_names(engine_args), flag_options())
    except ValueError:
        return None
    given = [p.value for p in parse_argv(argv)[0] if p.flag.name == "--hf-overrides"]
    return given[-1] if given else None

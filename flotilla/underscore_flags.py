"""vLLM's underscore spelling of a flag's name: `--max_model_len 4096`, `--max_model_len=4096` and
`--enable_prefix_caching` are `--max-model-len 4096`, `--max-model-len=4096` and `--enable-prefix-caching`.

As vLLM's FlexibleArgumentParser reads them (vllm/utils/argparse_utils.py): in a token that starts with `--`, the
underscores of the name up to the first `.` become dashes; a value after `=` and the keys of a dotted flag
(`--hf_overrides.rope_scaling.rope_type`) keep theirs, and so does every other token. Unlike vLLM, nothing after a
bare `--` (argparse's end of the flags) is rewritten.

Standard library only: the engine's parser, the --config file and the operator's check of spec.engineArgs all read
names through `dashed_names`, so each of them takes the same spellings.
"""

from __future__ import annotations


def dashed_name(token: str) -> str:
    """`token` with the underscores of its flag name written as dashes (`--max_model_len=a_b` ->
    `--max-model-len=a_b`); a token that is no long flag is returned as it is."""
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    base, dot, keys = name.partition(".")
    return base.replace("_", "-") + dot + keys + eq + value


def dashed_names(argv: list[str]) -> list[str]:
    """`argv` with each flag's name dashed (`dashed_name`), up to a bare `--`; the tokens after it are left alone."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        out.append(dashed_name(token))
    return out

"""`vllm serve` flags that vLLM itself has removed: refused by name, saying what vLLM removed and what takes their
place, rather than argparse's bare "unrecognized arguments" (a command line or manifest written for an older vLLM
fails the same way on today's vLLM, but without the why)."""

from __future__ import annotations

from flotilla.underscore_flags import dashed_name

_GUIDED = ("vLLM removed the --guided-decoding-* flags (its PR 22772, release 0.10.2) for --structured-outputs-config; "
           "give --structured-outputs-config.{key} VALUE (or the same key in --structured-outputs-config's JSON)")
# Each removed flag -> why it is refused.
REMOVED = {
    "--max-seq-len-to-capture": (
        "vLLM removed it with its V0 engine (PR 25543, release 0.11); here, too, there is no length above which a "
        "step falls back to eager: the CUDA graphs cover every context length up to --max-model-len. Leave it out "
        "(--max-cudagraph-capture-size bounds the captured batch sizes)"),
    "--guided-decoding-backend": _GUIDED.format(key="backend"),
    "--guided-decoding-disable-fallback": _GUIDED.format(key="disable_fallback"),
    "--guided-decoding-disable-any-whitespace": _GUIDED.format(key="disable_any_whitespace"),
    "--guided-decoding-disable-additional-properties": _GUIDED.format(key="disable_additional_properties"),
}


def removed_flag_problem(argv: list[str]) -> str | None:
    """Why the first removed vLLM flag in `argv` (as `--flag`, `--flag=value` or with underscores) is refused, or
    None."""
    for token in argv:
        name = dashed_name(token).partition("=")[0]
        if name in REMOVED:
            return f"{name} is not a flag of today's vLLM: {REMOVED[name]}"
    return None

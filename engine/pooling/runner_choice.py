"""Which runner serves a model: vLLM's `--runner`, `--convert` and the older `--task`, resolved once.

Pure (no torch): the engine's config builder calls it. vLLM's rules: `--runner auto` picks pooling for
architectures named like encoders (`*Model`, `*EmbeddingModel`, `*ForTextEncoding`), generate
otherwise; `--convert auto` is `embed` under the pooling runner; `--task embed` (or `embedding`) is
the older spelling of `--runner pooling --convert embed`.
"""

from __future__ import annotations

from typing import Any

_POOLING_SUFFIXES = ("ForTextEncoding", "EmbeddingModel", "Model")


class RunnerChoiceError(ValueError):
    """The runner flags contradict each other."""


def resolve_runner(runner: str, convert: str, task: str, hf_config: dict[str, Any]) -> tuple[str, str]:
    """(runner, convert) in force: ("generate", "none") or ("pooling", "embed")."""
    if task in ("embed", "embedding"):
        if runner == "generate":
            raise RunnerChoiceError(f"--task {task} asks for the pooling runner, but --runner is generate")
        runner = "pooling"
        convert = "embed" if convert == "auto" else convert
    elif task == "generate":
        if runner == "pooling":
            raise RunnerChoiceError("--task generate asks for the generate runner, but --runner is pooling")
        runner = "generate"
    if runner == "auto":
        archs = hf_config.get("architectures") or []
        runner = "pooling" if any(a.endswith(_POOLING_SUFFIXES) for a in archs) else "generate"
    if convert == "auto":
        convert = "embed" if runner == "pooling" else "none"
    if runner == "pooling" and convert != "embed":
        raise RunnerChoiceError("--runner pooling serves embeddings only here: --convert must be embed (or auto)")
    if runner == "generate" and convert != "none":
        raise RunnerChoiceError(f"--convert {convert} needs --runner pooling")
    return runner, convert

"""Which runner serves a model: vLLM's `--runner`, `--convert` and the older `--task`, resolved once.

Pure (no torch): the engine's config builder calls it. vLLM's rules: `--runner auto` picks pooling for
architectures named like encoders or classifiers, generate otherwise; `--convert auto` under the pooling
runner is the convert that architecture's name implies (`classify` for `*ForSequenceClassification`, `embed`
for the rest, a `*ForCausalLM` included); `--task embed` (or `embedding`) and `--task classify` are the older
spellings of `--runner pooling --convert embed|classify`, and `--task score` is `classify` on a classifier's
architecture and `embed` otherwise (a cross-encoder or a bi-encoder).
"""

from __future__ import annotations

from typing import Any

# vLLM's architecture-name suffixes that imply the pooling runner, with their convert, in its order of priority
# (the bare `Model` last: `...ForSequenceClassification` must not end in it, but `...EmbeddingModel` does).
_POOLING_SUFFIXES = (("ForTextEncoding", "embed"), ("EmbeddingModel", "embed"),
                     ("ForSequenceClassification", "classify"), ("ClassificationModel", "classify"), ("Model", "embed"))
# The older --task names of each pooling convert.
_TASK_CONVERTS = {"embed": "embed", "embedding": "embed", "classify": "classify"}


class RunnerChoiceError(ValueError):
    """The runner flags contradict each other."""


def implied_convert(hf_config: dict[str, Any]) -> str | None:
    """The convert config.json's `architectures` imply under the pooling runner (by name, as vLLM), or None for an
    architecture named for generation."""
    for arch in hf_config.get("architectures") or []:
        for suffix, convert in _POOLING_SUFFIXES:
            if arch.endswith(suffix):
                return convert
    return None


def resolve_runner(runner: str, convert: str, task: str, hf_config: dict[str, Any]) -> tuple[str, str]:
    """(runner, convert) in force: ("generate", "none"), ("pooling", "embed") or ("pooling", "classify")."""
    if task in (*_TASK_CONVERTS, "score"):
        if runner == "generate":
            raise RunnerChoiceError(f"--task {task} asks for the pooling runner, but --runner is generate")
        runner = "pooling"
        wanted = _TASK_CONVERTS.get(task) or ("classify" if implied_convert(hf_config) == "classify" else "embed")
        if convert not in ("auto", wanted):
            raise RunnerChoiceError(f"--task {task} asks for --convert {wanted}, but --convert is {convert}")
        convert = wanted
    elif task == "generate":
        if runner == "pooling":
            raise RunnerChoiceError("--task generate asks for the generate runner, but --runner is pooling")
        runner = "generate"
    if runner == "auto":
        runner = "pooling" if implied_convert(hf_config) is not None else "generate"
    if convert == "auto":
        convert = (implied_convert(hf_config) or "embed") if runner == "pooling" else "none"
    if runner == "pooling" and convert not in ("embed", "classify"):
        raise RunnerChoiceError("--runner pooling serves embeddings (--convert embed) or classification and "
                                "cross-encoder scores (--convert classify) here: --convert must be one of them (or "
                                "auto)")
    if runner == "generate" and convert != "none":
        raise RunnerChoiceError(f"--convert {convert} needs --runner pooling")
    if implied_convert(hf_config) == "classify" and (runner, convert) != ("pooling", "classify"):
        # its checkpoint has a score head and no LM head: nothing else can be loaded from it
        raise RunnerChoiceError(f"{hf_config['architectures'][0]} is a sequence classifier: serve it with --runner "
                                "pooling (or auto) and --convert classify (or auto)")
    return runner, convert

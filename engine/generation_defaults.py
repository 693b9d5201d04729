"""The model's recommended sampling defaults from generation_config.json (vLLM's `--generation-config`).

With `auto` (vLLM's default) a request that leaves out temperature, top_p, top_k, min_p or repetition_penalty
takes the model's value, and one without max_tokens takes its `max_new_tokens`; `vllm` keeps the neutral
defaults; a folder gives another generation_config.json. `--override-generation-config` (JSON, the same names)
is set over any of them. As vLLM, only the fields the file sets count
(transformers' `to_diff_dict`), and `do_sample` is not read.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def default_sampling_fields(generation_config: str, model_dir: str,
                            override: dict[str, Any] | None = None) -> dict[str, Any]:
    """SamplingParams fields (`max_new_tokens` as `max_tokens`) that requests leaving them out take:
    generation_config.json's, with `override` (--override-generation-config, same names) set over them, as
    vLLM's `get_diff_sampling_param` (so an override applies with `vllm` too, and without a file)."""
    given: dict[str, Any] = {}
    folder = Path(model_dir if generation_config == "auto" else generation_config)
    # a folder given is checked in config.py
    if generation_config != "vllm" and (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        given = GenerationConfig.from_pretrained(folder).to_diff_dict()
    given = {**given, **(override or {})}
    fields = {name: given[name] for name in SAMPLING_FIELDS if given.get(name) is not None}
    if "max_new_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_new_tokens")
    if fields:
        logger.warning("default sampling fields for requests that leave them out (--generation-config %s, "
                       "--override-generation-config %s): %s", generation_config, override or None, fields)
    return fields

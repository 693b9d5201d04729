"""The model's recommended sampling defaults from generation_config.json (vLLM's `--generation-config`).

With `auto` (vLLM's default) a request that leaves out temperature, top_p, top_k, min_p or repetition_penalty
takes the model's value, and one without max_tokens takes its `max_new_tokens`; `vllm` keeps the neutral
defaults; a folder gives another generation_config.json. As vLLM, only the fields the file sets count
(transformers' `to_diff_dict`), and `do_sample` is not read.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def default_sampling_fields(generation_config: str, model_dir: str) -> dict[str, Any]:
    """SamplingParams fields (`max_new_tokens` as `max_tokens`) that requests leaving them out take."""
    if generation_config == "vllm":
        return {}
    folder = Path(model_dir if generation_config == "auto" else generation_config)
    if not (folder / "generation_config.json").is_file():  # a folder given is checked in config.py
        return {}
    from transformers import GenerationConfig

    given = GenerationConfig.from_pretrained(folder).to_diff_dict()
    fields = {name: given[name] for name in SAMPLING_FIELDS if given.get(name) is not None}
    if "max_new_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_new_tokens")
    if fields:
        logger.warning("default sampling fields from %s/generation_config.json (--generation-config vllm to "
                       "ignore them): %s", folder, fields)
    return fields

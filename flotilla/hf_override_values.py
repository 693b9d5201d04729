"""The values --hf-overrides may give the config.json keys the engine reads, whatever the checkpoint: a positive
integer for a size, true or false for a switch, a rope scaling the rotary embedding computes
(flotilla/rope_scaling.py), a dtype the engine serves. The checks against the checkpoint's own config.json (shapes,
layers, experts) are engine/hf_overrides.py's, which applies these first.

Standard library only: the operator's webhook applies `override_values_problem` to spec.engineArgs' --hf-overrides,
so an InferenceService is refused for the same values, with the same words, as `flotilla serve`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flotilla.engine_rules import CHECKPOINT_DTYPES
from flotilla.rope_scaling import rope_scaling_problem

FLAG = "--hf-overrides"
# Positions are 32-bit in the engine's kernels, and the rotary table has a row per position.
MAX_POSITIONS = 2**31 - 1
# Each key the engine reads: what its value must be. "?" after a kind: null is allowed too (the engine then derives
# the value, as from a config.json without the key).
KINDS = {
    "vocab_size": "count", "hidden_size": "count", "intermediate_size": "count", "num_hidden_layers": "count",
    "num_attention_heads": "count", "num_key_value_heads": "count?", "head_dim": "count?",
    "max_position_embeddings": "length", "original_max_position_embeddings": "length?", "sliding_window": "count?",
    "rms_norm_eps": "positive", "rope_theta": "positive", "initializer_range": "positive",
    "is_matryoshka": "bool", "tie_word_embeddings": "bool", "attention_bias": "bool", "mlp_bias": "bool",
    "use_sliding_window": "bool", "rope_scaling": "rope?", "rope_parameters": "rope?",
    # the checkpoint's dtype, which --dtype auto serves (engine/config.py; transformers 5 writes `dtype`)
    "torch_dtype": "dtype?", "dtype": "dtype?",
    "quantization_config": "object", "hidden_act": "string", "architectures": "strings",
    # a sequence classifier's head (engine/pooling/classifier_config.py)
    "num_labels": "count", "id2label": "object", "classifier_from_token": "strings", "method": "string?",
    "problem_type": "string?", "is_original_qwen3_reranker": "bool",
    # a mixture of experts' (engine/layers/moe.py)
    "num_experts": "count?", "num_local_experts": "count?", "num_experts_per_tok": "count",
    "moe_intermediate_size": "count", "shared_expert_intermediate_size": "count?", "decoder_sparse_step": "count?",
    "mlp_only_layers": "indices?", "norm_topk_prob": "bool",
}
_WANTS = {"count": "a positive integer", "length": f"a positive integer up to {MAX_POSITIONS}",
          "positive": "a positive number", "bool": "true or false", "object": "a JSON object", "rope": "a JSON object",
          "string": "a string", "strings": "a list of strings",
          "indices": "a list of layer numbers (integers from 0)",
          "dtype": f"one of {', '.join(CHECKPOINT_DTYPES)}"}


def override_values_problem(overrides: Any) -> str | None:
    """Why `overrides` is no JSON object, or a key of it has a value the engine cannot run whatever the checkpoint
    (a string for a size, an unknown rope type or dtype), or None: the part of `hf_overrides_problem` that needs no
    config.json, which the operator's webhook applies to spec.engineArgs."""
    if not isinstance(overrides, dict):
        return f"{FLAG} must be a JSON object of config.json keys, not {json.dumps(overrides)}"
    for key, value in overrides.items():
        kind = KINDS.get(key)
        if kind is not None and not _is_kind(value, kind):
            return f"{FLAG}: {key} must be {_WANTS[kind.rstrip('?')]}, not {json.dumps(value)}"
        if kind == "rope?" and value is not None and (problem := rope_scaling_problem(value)):
            return f"{FLAG}: {key}: {problem}"
    return None


def _is_kind(value: Any, kind: str) -> bool:
    if value is None:
        return kind.endswith("?")
    kind = kind.rstrip("?")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "count":
        return number and isinstance(value, int) and value > 0
    if kind == "length":
        return number and isinstance(value, int) and 0 < value <= MAX_POSITIONS
    if kind == "positive":
        return number and math.isfinite(value) and value > 0
    if kind == "indices":
        return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                               for i in value)
    if kind == "dtype":
        return value in CHECKPOINT_DTYPES
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return isinstance(value, {"bool": bool, "object": dict, "rope": dict, "string": str}[kind])

"""--hf-overrides (vLLM's flag): keys set over config.json before the engine builds anything from it, and the checks
that turn an override the engine cannot run into a usage error naming the key.

config.json's own values are trusted (the checkpoint was saved with them); an override is not. Without these checks a
string for a size, a float or a 31-digit length, more layers than the checkpoint holds, or a width its tensors do not
have failed inside the engine process after the server had started (a traceback, "the engine failed to start"), and
a string for a flag (`is_matryoshka: "x"`) was read as true. Only the keys the engine reads are checked; any other
key is set as given, as vLLM sets it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flotilla.engine.pooling.classifier_config import head_method, num_labels
from flotilla.engine_rules import CHECKPOINT_DTYPES, moe_dense_layers, moe_expert_widths, moe_num_experts
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


def apply_hf_overrides(hf_config: dict[str, Any], overrides: Any) -> dict[str, Any]:
    """config.json with --hf-overrides' keys set over it, as vLLM sets them before building anything: each key
    replaces the value whole (an object too: vLLM merges an object only into a nested model config such as a
    multimodal model's text_config, which no architecture served here has) or adds a key config.json lacks.
    ValueError naming the key for an override the engine cannot run (`hf_overrides_problem`)."""
    if overrides is None:
        return hf_config
    if problem := hf_overrides_problem(hf_config, overrides):
        raise ValueError(problem)
    return hf_config | overrides


def hf_overrides_problem(hf_config: dict[str, Any], overrides: Any) -> str | None:
    """Why the engine cannot build `hf_config` (the checkpoint's config.json) with `overrides` set over it, or None."""
    if not isinstance(overrides, dict):
        return f"{FLAG} must be a JSON object of config.json keys, not {json.dumps(overrides)}"
    if problem := override_values_problem(overrides):
        return problem
    return _checkpoint_problem(hf_config, hf_config | overrides)


def override_values_problem(overrides: dict[str, Any]) -> str | None:
    """Why a key of `overrides` has a value the engine cannot run whatever the checkpoint (a string for a size, an
    unknown rope type or dtype), or None: the part of `hf_overrides_problem` that needs no config.json, which the
    operator's webhook applies to spec.engineArgs."""
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


def _weight_shapes(c: dict[str, Any]) -> dict[str, Any]:
    """The tensor shapes (and bias tensors) the engine builds from `c`: what the checkpoint's tensors must match."""
    heads = c.get("num_attention_heads")
    head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads and c.get("hidden_size") else None)
    kv_heads = c.get("num_key_value_heads") or heads
    return {"vocab_size": c.get("vocab_size"), "hidden_size": c.get("hidden_size"),
            "intermediate_size": c.get("intermediate_size"),
            "query width (num_attention_heads x head_dim)": heads * head_dim if heads and head_dim else None,
            "key/value width (num_key_value_heads x head_dim)": kv_heads * head_dim if kv_heads and head_dim else None,
            "attention_bias": bool(c.get("attention_bias", False)), "mlp_bias": bool(c.get("mlp_bias", False)),
            "expert count (num_local_experts or num_experts)": moe_num_experts(c),
            "expert widths (moe_intermediate_size, shared_expert_intermediate_size)": moe_expert_widths(c)}


def _checkpoint_problem(checkpoint: dict[str, Any], merged: dict[str, Any]) -> str | None:
    """Why the checkpoint's tensors cannot be loaded into the model `merged` describes, or None."""
    saved, wanted = _weight_shapes(checkpoint), _weight_shapes(merged)
    for what, value in wanted.items():
        if value != saved[what]:
            return (f"{FLAG}: the {what} would be {json.dumps(value)}, but the checkpoint's tensors were saved with "
                    f"{json.dumps(saved[what])}: an override may not change the shapes or the set of the weights")
    if (problem := _score_head_problem(checkpoint, merged)):
        return problem
    layers, saved_layers = merged.get("num_hidden_layers"), checkpoint.get("num_hidden_layers")
    if isinstance(saved_layers, int) and isinstance(layers, int) and layers > saved_layers:
        return (f"{FLAG}: num_hidden_layers {layers} is more than the checkpoint's {saved_layers} layers: the others "
                "have no weights (fewer layers load the first ones)")
    if problem := _experts_problem(checkpoint, merged):
        return problem
    heads, kv_heads = merged.get("num_attention_heads"), merged.get("num_key_value_heads") or 0
    if isinstance(heads, int) and kv_heads and heads % kv_heads:
        return (f"{FLAG}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}: each "
                "key/value head serves a whole group of query heads")
    return None


def _score_head_problem(checkpoint: dict[str, Any], merged: dict[str, Any]) -> str | None:
    """Why a sequence classifier's checkpoint `score.weight` (one row per label) cannot load into the head `merged`
    describes, or None. A head made from the LM head's rows (`classifier_from_token`) is not read from the
    checkpoint: its labels may be any number."""
    if not any(a.endswith("ForSequenceClassification") for a in checkpoint.get("architectures") or []):
        return None
    if head_method(merged) is not None:
        return None
    saved, wanted = num_labels(checkpoint), num_labels(merged)
    if wanted != saved:
        return (f"{FLAG}: the classifier would have {wanted} labels (id2label or num_labels), but the checkpoint's "
                f"score head was saved with {saved}: an override may not change the shapes of the weights")
    return None


def _experts_problem(checkpoint: dict[str, Any], merged: dict[str, Any]) -> str | None:
    """Why a mixture of experts' overrides cannot route or load (top-k above the experts; layers whose MLP would be
    dense where the checkpoint's holds experts, or the reverse), or None. Called once the shapes agree."""
    experts = moe_num_experts(merged)
    if not experts:
        return None
    top_k = merged.get("num_experts_per_tok", 2)
    if isinstance(top_k, int) and top_k > experts:
        return f"{FLAG}: num_experts_per_tok {top_k} is more than the model's {experts} experts"
    layers = merged.get("num_hidden_layers")
    if not isinstance(layers, int) or not isinstance(checkpoint.get("num_hidden_layers"), int):
        return None
    dense = moe_dense_layers(layers, merged.get("decoder_sparse_step"), merged.get("mlp_only_layers"))
    saved = moe_dense_layers(checkpoint["num_hidden_layers"], checkpoint.get("decoder_sparse_step"),
                             checkpoint.get("mlp_only_layers"))
    if dense != {i for i in saved if i < layers}:
        return (f"{FLAG}: decoder_sparse_step / mlp_only_layers would make layers {sorted(dense)} dense, but the "
                f"checkpoint's dense layers are {sorted(saved)}: an override may not change the set of the weights")
    return None

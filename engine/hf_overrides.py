"""--hf-overrides (vLLM's flag): keys set over config.json before the engine builds anything from it, and the checks
that turn an override the engine cannot run into a usage error naming the key.

config.json's own values are trusted (the checkpoint was saved with them); an override is not. Without these checks a
string for a size, a float or a 31-digit length, more layers than the checkpoint holds, or a width its tensors do not
have failed inside the engine process after the server had started (a traceback, "the engine failed to start"), and
a string for a flag (`is_matryoshka: "x"`) was read as true. Only the keys the engine reads are checked; any other
key is set as given, as vLLM sets it. The checks of the values alone (flotilla/hf_override_values.py) come first and
are the operator's too; those against the checkpoint's config.json are here.
"""

from __future__ import annotations

import json
from typing import Any

from flotilla.engine.pooling.classifier_config import head_method, num_labels
from flotilla.engine_rules import moe_dense_layers, moe_expert_widths, moe_num_experts
from flotilla.hf_override_values import FLAG, override_values_problem


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
    if problem := override_values_problem(overrides):
        return problem
    return _checkpoint_problem(hf_config, hf_config | overrides)


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

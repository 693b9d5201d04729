"""Which HF architectures Flotilla runs, and how each maps onto a model class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.models.llama import LlamaArch, LlamaForCausalLM


def _llama(c: dict[str, Any]) -> CausalLM:
    return LlamaForCausalLM(LlamaArch.from_hf(c))


def _qwen2(c: dict[str, Any]) -> CausalLM:
    return LlamaForCausalLM(LlamaArch.from_hf(c, qkv_bias=True))


def _qwen3(c: dict[str, Any]) -> CausalLM:
    # Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads (HF and vLLM read it so)
    return LlamaForCausalLM(LlamaArch.from_hf({"head_dim": 128} | c, qk_norm=True))


# HF `architectures[0]` -> builder from config.json. The sequence classifiers (`--convert classify`) are the same
# body, whose LM head the loader swaps for the `score` head (engine/pooling/score_head.py).
_REGISTRY: dict[str, Callable[[dict[str, Any]], CausalLM]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "LlamaForSequenceClassification": _llama,
    "MistralForSequenceClassification": _llama,
    "Qwen2ForSequenceClassification": _qwen2,
    "Qwen3ForSequenceClassification": _qwen3,
}


def supported_architectures() -> list[str]:
    """Names accepted in config.json's `architectures`."""
    return sorted(_REGISTRY)


def architecture_problem(hf_config: dict[str, Any]) -> str | None:
    """Why no architecture of config.json's `architectures` is served here, or None."""
    archs = hf_config.get("architectures") or []
    if any(arch in _REGISTRY for arch in archs):
        return None
    return (f"unsupported model architecture {archs or '(none in config.json)'}; "
            f"supported: {', '.join(supported_architectures())}")


def build_model(hf_config: dict[str, Any]) -> CausalLM:
    """Instantiate (uninitialised) the model class for `hf_config`; unknown architectures are an error (the
    engine's config refuses them before: `architecture_problem`)."""
    for arch in hf_config.get("architectures") or []:
        if arch in _REGISTRY:
            return _REGISTRY[arch](hf_config)
    raise ValueError(architecture_problem(hf_config))

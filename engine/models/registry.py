"""Which HF architectures Flotilla runs, and how each maps onto a model class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.models.llama import LlamaArch, LlamaForCausalLM, activation_problem

# HF `architectures[0]` -> builder from config.json
_REGISTRY: dict[str, Callable[[dict[str, Any]], CausalLM]] = {
    "LlamaForCausalLM": lambda c: LlamaForCausalLM(LlamaArch.from_hf(c)),
    "MistralForCausalLM": lambda c: LlamaForCausalLM(LlamaArch.from_hf(c)),
    "Qwen2ForCausalLM": lambda c: LlamaForCausalLM(LlamaArch.from_hf(c, qkv_bias=True)),
    # Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads (HF and vLLM read it so)
    "Qwen3ForCausalLM": lambda c: LlamaForCausalLM(LlamaArch.from_hf({"head_dim": 128} | c, qk_norm=True)),
}


def supported_architectures() -> list[str]:
    """Names accepted in config.json's `architectures`."""
    return sorted(_REGISTRY)


def architecture_problem(hf_config: dict[str, Any]) -> str | None:
    """Why no architecture of config.json's `architectures` is served here, or None."""
    archs = hf_config.get("architectures") or []
    if not any(arch in _REGISTRY for arch in archs):
        return (f"unsupported model architecture {archs or '(none in config.json)'}; "
                f"supported: {', '.join(supported_architectures())}")
    return activation_problem(hf_config)  # config.json's (or --hf-overrides'), before anything loads


def build_model(hf_config: dict[str, Any]) -> CausalLM:
    """Instantiate (uninitialised) the model class for `hf_config`; unknown architectures are an error (the
    engine's config refuses them before: `architecture_problem`)."""
    for arch in hf_config.get("architectures") or []:
        if arch in _REGISTRY:
            return _REGISTRY[arch](hf_config)
    raise ValueError(architecture_problem(hf_config))

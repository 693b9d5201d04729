"""Which HF architectures Flotilla runs, and how each maps onto a model class.

The model classes (torch) are imported when a model is built: the API process checks a config.json against this
table without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flotilla.engine_rules import moe_expert_widths

if TYPE_CHECKING:
    from flotilla.engine.models.causal_lm import CausalLM


def _llama(c: dict[str, Any], *, qkv_bias: bool | None = None, qk_norm: bool = False) -> CausalLM:
    from flotilla.engine.models.llama import LlamaArch, LlamaForCausalLM

    return LlamaForCausalLM(LlamaArch.from_hf(c, qkv_bias=qkv_bias, qk_norm=qk_norm))


def _qwen2(c: dict[str, Any]) -> CausalLM:
    return _llama(c, qkv_bias=True)


def _qwen3(c: dict[str, Any]) -> CausalLM:
    # Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads (HF and vLLM read it so)
    return _llama({"head_dim": 128} | c, qk_norm=True)


def _mixtral(c: dict[str, Any]) -> CausalLM:
    """Mixtral: Mistral's attention; every layer's MLP is a MoE block of `intermediate_size`-wide experts, top-k
    weights always renormalised and kept in fp32 (HF's MixtralTopKRouter)."""
    from flotilla.engine.layers.moe import MoeArch
    from flotilla.engine.models.llama import LlamaArch, LlamaForCausalLM

    moe = MoeArch.from_hf(c, renormalize=True, expert_width="intermediate_size", round_router_weights=False)
    return LlamaForCausalLM(replace(LlamaArch.from_hf(c), moe=moe))


def _qwen_moe(c: dict[str, Any], *, qkv_bias: bool | None, qk_norm: bool) -> CausalLM:
    """Qwen2-MoE (QKV bias, a gated shared expert) and Qwen3-MoE (q/k norm): `moe_intermediate_size`-wide experts
    on the layers `decoder_sparse_step`/`mlp_only_layers` choose, renormalised when `norm_topk_prob`."""
    from flotilla.engine.layers.moe import MoeArch
    from flotilla.engine.models.llama import LlamaArch, LlamaForCausalLM

    return LlamaForCausalLM(replace(LlamaArch.from_hf(c, qkv_bias=qkv_bias, qk_norm=qk_norm), moe=MoeArch.from_hf(c)))


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
    "MixtralForCausalLM": _mixtral,
    # Qwen2MoeConfig's qkv_bias defaults to true (Qwen1.5-MoE's config.json leaves it out)
    "Qwen2MoeForCausalLM": lambda c: _qwen_moe(c, qkv_bias=bool(c.get("qkv_bias", True)), qk_norm=False),
    # Qwen3-MoE's head_dim defaults to hidden_size / num_attention_heads (HF's attention reads it so), not 128
    "Qwen3MoeForCausalLM": lambda c: _qwen_moe(c, qkv_bias=None, qk_norm=True),
}

_MOE_ARCHITECTURES = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})


def supported_architectures() -> list[str]:
    """Names accepted in config.json's `architectures`."""
    return sorted(_REGISTRY)


def architecture_problem(hf_config: dict[str, Any]) -> str | None:
    """Why no architecture of config.json's `architectures` is served here, or None."""
    archs = hf_config.get("architectures") or []
    served = next((arch for arch in archs if arch in _REGISTRY), None)
    if served is None:
        return (f"unsupported model architecture {archs or '(none in config.json)'}; "
                f"supported: {', '.join(supported_architectures())}")
    # An architecture and its experts must agree: --hf-overrides' architectures over a MoE checkpoint (a dense
    # classifier's name, say) built a dense model whose loader found no place for the experts' tensors.
    experts = moe_expert_widths(hf_config) is not None
    if experts != (served in _MOE_ARCHITECTURES):
        return (f"architecture {served} is {'not ' if experts else ''}a mixture of experts, but config.json "
                f"{'names' if experts else 'names no'} experts (num_local_experts / num_experts); mixture-of-experts "
                f"architectures: {', '.join(sorted(_MOE_ARCHITECTURES))}")
    return activation_problem(hf_config)  # config.json's (or --hf-overrides'), before anything loads


def activation_problem(c: dict[str, Any]) -> str | None:
    """Why config.json's `hidden_act` cannot run here, or None: the MLP computes SiLU only, and another activation
    would run as SiLU and generate other tokens than HF."""
    act = c.get("hidden_act", "silu")
    if act in ("silu", "swish"):  # transformers' ACT2FN: "swish" is SiLU too
        return None
    return f"config.json hidden_act {act!r} is not supported (only silu), as in vLLM"


def build_model(hf_config: dict[str, Any]) -> CausalLM:
    """Instantiate (uninitialised) the model class for `hf_config`; unknown architectures are an error (the
    engine's config refuses them before: `architecture_problem`)."""
    for arch in hf_config.get("architectures") or []:
        if arch in _REGISTRY:
            return _REGISTRY[arch](hf_config)
    raise ValueError(architecture_problem(hf_config))

"""Per-layer fp8 KV-cache scales read from a checkpoint.

Checkpoints made for fp8 KV caches carry one K and one V scale per attention layer, under names that
differ by tool: `self_attn.k_scale` / `v_scale` (llm-compressor, vLLM), `self_attn.kv_scale` (one for
both, older AutoFP8) or `self_attn.k_proj.output_scale` / `v_proj.output_scale` (older
compressed-tensors). They land on the layer's `Attention` module; the model runner keeps them only
when the cache is fp8 (vLLM's behaviour: otherwise they are ignored, and absent scales are 1.0).
"""

from __future__ import annotations

import torch
from torch import nn

_SUFFIXES = {
    ".k_proj.output_scale": ("k",),
    ".v_proj.output_scale": ("v",),
    ".kv_scale": ("k", "v"),
    ".k_scale": ("k",),
    ".v_scale": ("v",),
}


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """For a parameter-style name (`layers.3.self_attn.k_scale`), the attention module's path and which
    scales it sets; None for other tensors."""
    if ".self_attn." not in name:
        return None
    for suffix, which in _SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)].split(".self_attn")[0] + ".self_attn.attn", which
    return None


def set_kv_scale(model: nn.Module, path: str, which: tuple[str, ...], tensor: torch.Tensor) -> None:
    """Set `k_scale` / `v_scale` of the attention module at `path` (a per-tensor scale; the largest
    value if a checkpoint stores several)."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        raise ValueError(f"checkpoint KV scale for {path}: the model has no such attention layer") from None
    for w in which:
        setattr(module, f"{w}_scale", float(tensor.float().max()))
    setattr(module, "scales_from_checkpoint", True)  # noqa: B010 - an Attention, typed as a plain Module here

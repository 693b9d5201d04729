"""Paged attention as a layer: writes the step's K/V into this layer's blocks, then attends.

This is the engine's single attention dispatch point; which kernel runs is decided in
`flotilla.kernels.dispatch`.
"""

from __future__ import annotations

import torch
from torch import nn

from flotilla.engine.forward_context import AttentionMetadata, current_attention_metadata
from flotilla.kernels.dispatch import (
    paged_attention,
    qkv_rotary_and_write_kv,
    rotary_and_write_kv,
    write_kv_cache,
)
from flotilla.kernels.packed_int_linear import PackedInt4


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads over the paged KV cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # Bound by the model runner once the pool is allocated: `[num_blocks, block_size, kv_heads, head_dim]`.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        # An fp8 cache stores K / k_scale and V / v_scale (`kernels/paged_attention.py`): vLLM's 1.0,
        # the checkpoint's per-layer scales, or calculated ones (--calculate-kv-scales), all set before
        # any CUDA graph is captured (graphs bake these floats in).
        self.k_scale = 1.0
        self.v_scale = 1.0
        # True once the checkpoint set them: --calculate-kv-scales leaves those alone.
        self.scales_from_checkpoint = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor | None = None,
        cos_sin_cache: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q `[T, H*D]`, k/v `[T, Hkv*D]` -> `[T, H*D]`.

        With `positions` and a rotary `cos_sin_cache`, q and k are rotated here, fused with the KV
        write (the rotated key goes straight into the cache).
        """
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        meta = current_attention_metadata()
        if meta is None:
            # No cache yet (memory profiling): the paged kernels need O(tokens) memory, their output,
            # so stand in with that instead of materialising a whole-batch attention matrix.
            return torch.zeros_like(q).view(-1, self.num_heads * self.head_dim)
        if cos_sin_cache is not None:
            if positions is None:
                raise ValueError("rotary attention needs the tokens' positions")
            q = rotary_and_write_kv(positions, q, k, v, cos_sin_cache, self.k_cache, self.v_cache, meta.slot_mapping,
                                    self.k_scale, self.v_scale, step_memo=meta.derived)
        else:
            write_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.k_scale, self.v_scale)
        return self._attend(q, meta)

    def forward_projected(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | PackedInt4,
        bias: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        weight_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward` of `x @ weight.T (+ bias)`'s q/k/v heads (one row, where `dispatch.qkv_rope_takes`, an fp8
        `weight` with its per-row `weight_scale` where `dispatch.fp8_qkv_rope_takes`, or an int4 `PackedInt4` where
        `dispatch.int4_qkv_rope_takes`): the projection, rotary and the KV write in one kernel
        (`qkv_rotary_and_write_kv`), then attention."""
        meta = current_attention_metadata()
        if meta is None:  # memory profiling, as `forward`
            return torch.zeros(x.shape[0], self.num_heads * self.head_dim, dtype=x.dtype, device=x.device)
        fp8 = {} if weight_scale is None else {"weight_scale": weight_scale}
        q = qkv_rotary_and_write_kv(x, weight, bias, positions, cos_sin_cache, self.k_cache, self.v_cache,
                                    meta.slot_mapping, self.num_heads, self.num_kv_heads, self.k_scale, self.v_scale,
                                    **fp8)  # fmt: skip
        return self._attend(q, meta)

    def _attend(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Paged attention of the (rotated) query `[T, H, D]` over this layer's cache -> `[T, H*D]`."""
        out = paged_attention(
            q, self.k_cache, self.v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, self.scale,
            max_query_len=meta.max_query_len, k_scale=self.k_scale, v_scale=self.v_scale, step_memo=meta.derived,
        )
        return out.view(-1, self.num_heads * self.head_dim)

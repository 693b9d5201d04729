"""A paged KV pool for the decode-attention benchmarks (Llama-3.1-8B heads, 16-token pages).

`sets` copies of one decode shape: K/V pages shuffled over the whole pool by the block tables, and a query
per copy, so that a CUDA graph rotating over the copies finds no call's K/V in L2 (`l2_sets` copies fill
more than 256 MiB, over 4x the H200's 60 MB L2). The random tensors are drawn in one fixed order (K, V,
the page permutation, the queries), so that a script seeded the same gets the same values through it.
"""

from __future__ import annotations

import torch

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
L2_ROTATION_BYTES = 256 << 20


def l2_sets(batch: int, ctx: int) -> int:
    """Copies of `batch` sequences of `ctx` tokens (bf16 K+V) that together exceed L2_ROTATION_BYTES."""
    blocks = batch * ctx // PAGE
    return max(1, -(-L2_ROTATION_BYTES // (2 * blocks * PAGE * KV_HEADS * HEAD_DIM * 2)))


def decode_pool(batch: int, ctx: int, sets: int) -> dict[str, torch.Tensor]:
    """bf16 `k`/`v` pools `[sets * batch * ctx / PAGE, PAGE, KV_HEADS, HEAD_DIM]`, `tables` `[sets, batch,
    ctx / PAGE]` (a permutation of the pages), `q` `[sets, batch, HEADS, HEAD_DIM]`, and one decode token per
    sequence: `qsl` (query start offsets) and `lens` (`ctx` each)."""
    blocks = sets * (batch * ctx // PAGE)
    k = torch.randn(blocks, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(sets, batch, -1)
    return {"k": k, "v": v, "tables": tables,
            "q": torch.randn(sets, batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
            "qsl": torch.arange(batch + 1, device="cuda", dtype=torch.int32),
            "lens": torch.full((batch,), ctx, device="cuda", dtype=torch.int32)}  # fmt: skip

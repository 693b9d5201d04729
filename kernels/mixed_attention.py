"""A mixed step's attention in two launches: decode rows through the decode kernel, the rest through prefill.

A large step of the offline run holds hundreds of decode rows (one new token over a context of a few hundred)
beside a few whole prompts. The prefill kernel handles both, but a decode row costs it a 128-row tile with only
the group's few query heads valid, and its K/V streams at the tile's pace (issue 19: `_prefill_kernel` 35.5 ms of
a 372 ms step of 448 decode rows + 31 prompts of 512 tokens on the H100, bench/mixed_step_profile.py). Here the
prefill kernel's tile map gives sequences of one new token no tile, and the split-KV decode kernel attends to
exactly those sequences (it skips every sequence whose query count is not one), both writing into one output.

Which sequence is which is read on the device from `query_start_loc`, so nothing syncs with the host, the
grids come from shapes (both kernels' dead programs exit at once), the decode rows need not come first in the
batch, and a mixed CUDA graph captures the pair as it does the one launch. The prefill kernel runs first: where
its keys are split, its merge writes every token row, the decode rows included, and the decode kernel's stores
come after. An fp8 pool's V scale multiplies the whole output at the end, as on the one-launch path.
"""

from __future__ import annotations

import torch

from flotilla.kernels.triton_paged_decode import paged_decode_attention
from flotilla.kernels.triton_paged_prefill import paged_prefill_attention


def mixed_split_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    v_scale: float = 1.0,
    step_memo: dict | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    num_splits: int | None = None,
    lean: bool | None = None,
    rescale_tau: float | None = None,
    reciprocal: bool | None = None,
    dead_last: bool | None = None,
) -> torch.Tensor:
    """`paged_attention`'s result for any flattened batch (arguments as `paged_attention_ref`; `scale` with an
    fp8 pool's K scale folded in), as the prefill kernel over the sequences of several new tokens and the decode
    kernel over those of one. `block_m` .. `dead_last`: the prefill kernel's launch knobs and loop forms (the
    benchmark's sweep, the tests), its defaults where None."""
    out = paged_prefill_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                  block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                                  num_splits=num_splits, step_memo=step_memo, skip_decode_rows=True, lean=lean,
                                  rescale_tau=rescale_tau, reciprocal=reciprocal,
                                  dead_last=dead_last)  # fmt: skip
    # PDL stays off: the decode kernel must not store before the prefill kernel's merge is done, and the
    # one-launch path it replaces has none either
    paged_decode_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out=out,
                           pdl_merge=False, early_start=False, dependents=False)  # fmt: skip
    return out if v_scale == 1.0 else out * v_scale


__all__ = ["mixed_split_attention"]

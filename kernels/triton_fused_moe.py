"""The routed experts' gated MLPs in Triton: two grouped GEMMs over token blocks sorted by expert (the structure of
vLLM's fused_moe), with `fused_experts_ref`'s arguments and values (kernels/moe.py).

The (token, slot) pairs are grouped by expert and each expert's group padded to a whole block of `BLOCK_M` rows
(`align_by_expert`, plain torch ops that never read a count on the host, so a CUDA graph can hold them: the padded
length is bounded by `pairs + experts x (BLOCK_M - 1)`). One program computes a `BLOCK_M x BLOCK_N` tile of one
block: the rows' inputs gathered by pair (a token's hidden state for gate/up, its pair's activation for down), the
block's expert's weight tile, fp32 accumulation; the down GEMM multiplies each row by its router weight before the
one rounding. Padding rows and blocks past the last expert's are skipped. A token's slots are then summed.

Rounding differs from the reference in one place: the reference rounds each expert's down output to the
activations' dtype before weighting it, the kernel weights the fp32 sum; and the slot sum runs in slot order,
not expert order. Equal in fp32 up to summation order; tests compare within a tolerance.

fp8 experts (W8A16): the weight tile loads as float8_e4m3fn (half the bytes of bf16, the part that bounds a decode
step) and is upcast in registers to the activations' dtype for `tl.dot` (exact: every e4m3 value is a bf16 one);
each output column's per-row scale multiplies the finished fp32 sum, before the router weight and the rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.triton_utils import dot_dtype, dot_precision


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(`sorted_pairs` `[padded]`: flat pair indices grouped by expert, each group padded to a multiple of `block_m`
    with the sentinel `pairs`; `block_experts` `[padded / block_m]`: each block's expert, `num_experts` for a block
    past the last group). Stable: an expert's pairs keep their order."""
    flat = topk_ids.flatten()
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded_counts = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded_counts, 0)
    starts = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    dest = (padded_ends - padded_counts)[experts] + torch.arange(pairs, device=device) - starts[experts]
    padded = pairs + num_experts * (block_m - 1)
    padded = (padded + block_m - 1) // block_m * block_m
    sorted_pairs = torch.full((padded,), pairs, dtype=torch.int64, device=device)
    sorted_pairs.scatter_(0, dest, order)
    block_starts = torch.arange(0, padded, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    return sorted_pairs, block_experts


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, out_ptr, sorted_pairs_ptr, block_experts_ptr, weights_ptr, w_scale_ptr,
                         num_pairs, num_experts, n, k, stride_am, stride_we, stride_wn, stride_om,
                         A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr, W_SCALED: tl.constexpr,
                         DOT_DTYPE: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert >= num_experts:  # a block past the last expert's rows
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs_ptr + rows)
    valid = pair < num_pairs
    a_row = (pair // A_ROW_DIV).to(tl.int64)  # gate/up: the pair's token; down: the pair itself
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k
        a = tl.load(a_ptr + a_row[:, None] * stride_am + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
    if W_SCALED:  # fp8 weights: each output row's scale on the fp32 sum (`w_scale` is `[E, n]`, contiguous)
        acc *= tl.load(w_scale_ptr + expert.to(tl.int64) * n + cols, mask=col_ok, other=0.0)[None, :]
    if MUL_WEIGHT:
        acc *= tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + pair.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, sorted_pairs: torch.Tensor, block_experts: torch.Tensor,
                  num_pairs: int, a_row_div: int, weights: torch.Tensor | None, w_scale: torch.Tensor | None,
                  block_m: int, block_n: int, block_k: int) -> torch.Tensor:
    """`out[p] = a[p // a_row_div] @ w[expert(p)].T (x w_scale[expert(p)]) (x weights[p])` for every pair `p`:
    `[num_pairs, N]`."""
    n, k = w.shape[1], w.shape[2]
    assert a.stride(-1) == 1 and w.stride(-1) == 1
    assert w_scale is None or (w_scale.dtype == torch.float32 and w_scale.is_contiguous()
                               and tuple(w_scale.shape) == (w.shape[0], n))
    out = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    grid = (block_experts.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, w, out, sorted_pairs, block_experts, weights if weights is not None else a,
        w_scale if w_scale is not None else a, num_pairs, w.shape[0], n, k, a.stride(0), w.stride(0), w.stride(1),
        out.stride(0), A_ROW_DIV=a_row_div, MUL_WEIGHT=weights is not None, W_SCALED=w_scale is not None,
        DOT_DTYPE=dot_dtype(a.dtype), DOT_PRECISION=dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k)
    return out


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  *, block_m: int = 16, block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """`fused_experts_ref`'s result (kernels/moe.py) for `x` `[T, H]`, `w13` `[E, 2I, H]`, `w2` `[E, H, I]`,
    `topk_weights` and `topk_ids` `[T, top_k]`: two grouped GEMMs and SiLU-and-mul between them. fp8 `w13` / `w2`
    come with fp32 per-row scales `w13_scale` `[E, 2I]` / `w2_scale` `[E, H]`."""
    from flotilla.kernels.triton_activation import silu_and_mul

    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    if pairs == 0:
        return torch.zeros_like(x)
    sorted_pairs, block_experts = align_by_expert(topk_ids, w13.shape[0], block_m)
    gate_up = _grouped_gemm(x.contiguous(), w13, sorted_pairs, block_experts, pairs, top_k, None, w13_scale,
                            block_m, block_n, block_k)
    down = _grouped_gemm(silu_and_mul(gate_up), w2, sorted_pairs, block_experts, pairs, 1,
                         topk_weights.flatten().float().contiguous(), w2_scale, block_m, block_n, block_k)
    return down.view(tokens, top_k, -1).sum(dim=1)

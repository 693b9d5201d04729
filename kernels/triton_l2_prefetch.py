"""Asking L2 for a weight ahead of its GEMM (Hopper's `cp.async.bulk.prefetch.L2`), for the batch-1 decode chain.

At batch 1 HBM idles while the small kernels between two projections run (norm, activation, attention). With
programmatic dependent launch (`kernels/pdl.py`) a kernel can start during its predecessor; one that only asks L2
for the next projection's weight then turns that idle time into weight stream, and the projection's loads hit L2.
`prefetch_l2` is the in-kernel request (the PDL GEMV issues it for its own rows); `l2_prefetch` launches it for a
projection that cuBLAS runs (no Triton prologue to put it in): `num_sms` programs, one bulk request a thread over
the weight's first bytes, launched by PDL and waiting at the end, so that it completes only after its predecessor
and the stream's order holds for the plain cuBLAS launch behind it. No results: nothing to compare but that the
launch is a no-op for every value (the GPU tests run it in the chain).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.pdl import L2_PREFETCH_MB, pdl_active
from flotilla.kernels.triton_utils import device_sms

_THREADS = 128  # one bulk request a thread, 4 warps a program


@triton.jit
def prefetch_l2(ptrs, nbytes):
    """Ask L2 for `nbytes` (a tensor of int32 byte counts, multiples of 16) at each of `ptrs` (16-byte aligned).
    Fire and forget: no data comes back to the SM, nothing waits for it."""
    tl.inline_asm_elementwise(
        "{ cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }", "=r,l,r", [ptrs, nbytes], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _l2_prefetch_kernel(w_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # one CHUNK-byte request a thread over the first programs * BLOCK * CHUNK bytes of w (bytes)
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK
    prefetch_l2(w_ptr + offs, tl.full([BLOCK], CHUNK, tl.int32))
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()  # completes after the kernel ahead: the plain launch behind sees the stream's order


def l2_prefetch_bytes(weight: torch.Tensor, budget_mb: float, programs: int) -> int:
    """Bytes a thread asks for: the weight's first `budget_mb` MB (or all of it) over `programs` x 128 threads,
    rounded down to 16; 0 where there is no budget or the weight is not one contiguous, 16-byte aligned block."""
    if budget_mb <= 0 or not weight.is_contiguous() or weight.data_ptr() % 16:
        return 0
    total = min(int(budget_mb * (1 << 20)), weight.numel() * weight.element_size())
    return total // (programs * _THREADS) // 16 * 16


def l2_prefetch(weight: torch.Tensor, x: torch.Tensor, budget_mb: float | None = None) -> None:
    """Launch the prefetch of `weight`'s first `budget_mb` MB (default FLOTILLA_PDL_L2_MB) by PDL, where the
    projection of activations `x` launches by PDL (`pdl_active(x)`: one row); otherwise nothing (a plain launch
    would run it after its predecessor: no overlap to gain)."""
    budget = L2_PREFETCH_MB if budget_mb is None else budget_mb
    if budget <= 0 or not pdl_active(x):
        return
    programs = device_sms(weight)
    chunk = l2_prefetch_bytes(weight, budget, programs)
    if chunk:
        _l2_prefetch_kernel[(programs,)](weight.view(torch.uint8), CHUNK=chunk, BLOCK=_THREADS, num_warps=4,
                                         launch_pdl=True)  # fmt: skip


__all__ = ["l2_prefetch", "l2_prefetch_bytes", "prefetch_l2"]

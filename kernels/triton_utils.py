"""What every Triton kernel module here shares: interpreter detection and launch-time constants.

Importing this module imports Triton, so only the Triton kernel modules import it; the CPU path of
`dispatch` never does.
"""

from __future__ import annotations

import functools
import os

import torch
import triton.language as tl

# Triton reads TRITON_INTERPRET when a `@triton.jit` decorator runs, so reading it at import time
# (when this module's importers define their kernels) tells us how those kernels will execute.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The operand dtype for `tl.dot` on inputs of `dtype`.

    On the GPU, half-precision operands feed the tensor cores directly (accumulation stays fp32).
    The interpreter's bf16 arithmetic is wrong (FACTS.md), so there every operand is fp32.
    """
    if INTERPRETING or dtype not in _TL_DTYPES:
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input precision: exact fp32 (no tf32 rounding) when the operands are fp32."""
    return "ieee" if dot_dtype(dtype) == tl.float32 else "tf32"


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors on a CUDA device (132 on an H200)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(tensor: torch.Tensor) -> int:
    """SM count for the tensor's device; an H200's count when it is not on CUDA (interpreter tests)."""
    if tensor.is_cuda:
        return num_sms(tensor.device.index if tensor.device.index is not None else 0)
    return 132


def paged_attention_shapes(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """`(num_tokens, num_heads, head_dim, page, num_kv_heads)` of a paged attention call (layout in
    `paged_attention.py`), after checking what the kernels rely on: query heads split evenly over the
    KV heads, and every last dimension is contiguous."""
    num_tokens, num_heads, head_dim = query.shape
    _, page, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    return num_tokens, num_heads, head_dim, page, num_kv_heads

"""Weight-only integer linear layers on the CPU through torch's packed int4 / int8 GEMM kernels.

The reference (`packed_int_linear_ref`) dequantizes the whole weight on every call; here it is
re-laid-out once at load into what `torch._weight_int4pack_mm_for_cpu` (4-bit codes in groups of 32,
64, 128 or 256 inputs) or `torch._weight_int8pack_mm` (8-bit codes, one scale per output row) read,
and each call multiplies with the packed weight: a quarter (half) of a bf16 weight's bytes.
torch's int4 kernel dequantizes a code as `(code - 8) * scale + bias` per group, so the engine's
`(code - zero) * scale` becomes bias `(8 - zero) * scale`; an 8-bit code `c` is the signed `c - zero`.
Only for bf16/fp16 activations: torch's fp32 int4 path is slower than a dense fp32 GEMM on AVX2.
Tests check both against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flotilla.kernels.packed_int_linear import unpack_codes

INT4_GROUPS = (32, 64, 128, 256)


@dataclass
class CpuIntWeight:
    """A weight in the layout of torch's CPU kernel: `packed` codes and `scales` (int4: scale and bias
    per group `[in / group, out, 2]`; int8: one scale per output row `[out]`)."""

    bits: int
    group_size: int
    packed: torch.Tensor
    scales: torch.Tensor
    # 2: an 8-bit weight as two 4-bit planes side by side along the inputs (`cpu_int8_blocks_weight`), fed the
    # activations twice
    planes: int = 1


def cpu_int_weight(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
                   group_size: int) -> CpuIntWeight | None:
    """The engine's packed weight re-laid-out for torch's CPU kernels; None when they cannot run it
    (fp32 scales, a group size they lack, 8-bit codes with more than one group a row, or zero points
    other than the middle code for 8 bits)."""
    if scales.dtype not in (torch.bfloat16, torch.float16):
        return None
    codes = unpack_codes(packed, bits)
    if bits == 4:
        scale = scales.float()
        return cpu_int4_affine_weight(codes, scale, (8 - zeros.float()) * scale, group_size, scales.dtype)
    if bits == 8 and scales.shape[1] == 1 and bool((zeros == 128).all()):
        return cpu_int8_weight((codes - 128).to(torch.int8), scales, scales.dtype)
    return None


def cpu_int8_weight(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> CpuIntWeight | None:
    """Signed int8 codes `[out, in]` with one scale a row (`[out, 1]`, any float dtype) as `torch._weight_int8pack_mm`
    reads them, the scales rounded to `dtype` (the activations'); the codes are shared when contiguous. None for a
    dtype other than bf16/fp16 (see the module docstring)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    return CpuIntWeight(8, codes.shape[1], codes.contiguous(), scale[:, 0].to(dtype).contiguous())


def cpu_int4_affine_weight(codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, group_size: int,
                           dtype: torch.dtype) -> CpuIntWeight | None:
    """4-bit codes `[out, in]` whose weight is `(code - 8) * scale + bias` a group (scale and bias `[out, in /
    group]`, any float dtype) in torch's int4 layout with scale and bias in `dtype` (the activations'); None when
    the kernel lacks the group size or the dtype."""
    cols = codes.shape[1]
    if group_size not in INT4_GROUPS or cols % group_size or dtype not in (torch.bfloat16, torch.float16,
                                                                           torch.float32):
        return None
    weight = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    pair = torch.stack([scale.float().t(), bias.float().t()], dim=-1)
    return CpuIntWeight(4, group_size, weight, pair.to(dtype).contiguous())


def cpu_int8_blocks_weight(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                           group_size: int = 32) -> CpuIntWeight | None:
    """Signed 8-bit codes `[out, in]` with one scale a group of `group_size` inputs (`[out, in / group]`; GGUF's
    Q8_0) as torch's int4 layout, exactly: code `q = 16 hi + lo` (`hi` in [-8, 7], `lo` in [0, 15]) becomes two
    4-bit planes side by side along the inputs, `hi` with scale `16 d` and bias 0, `lo` with scale `d` and bias
    `8 d`, and `cpu_int_linear` multiplies `[x, x]` by them: `d (16 hi + lo) = d q`. Half a bf16 weight's bytes
    and torch's fastest CPU kernel at one row (2-4x a dense bf16 matmul here); the weight's values are the codes
    times the scale rounded to `dtype`, where a dense `dtype` weight rounds each product. None when the int4
    kernel cannot take it (`cpu_int4_affine_weight`)."""
    q = codes.to(torch.int32)
    hi, lo = torch.div(q, 16, rounding_mode="floor"), q % 16
    d = scale.float()
    both = torch.cat([hi + 8, lo], dim=1)
    weight = cpu_int4_affine_weight(both, torch.cat([16 * d, d], dim=1), torch.cat([torch.zeros_like(d), 8 * d], dim=1),
                                    group_size, dtype)
    if weight is None:
        return None
    weight.planes = 2
    return weight


def cpu_int_linear(x: torch.Tensor, weight: CpuIntWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W^T + b` for `x` `[..., in]` in the scales' dtype."""
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # the decode step's rows: no reshapes either side
    if weight.planes == 2:
        flat = torch.cat([flat, flat], dim=-1)
    if weight.bits == 4:
        out = torch._weight_int4pack_mm_for_cpu(flat, weight.packed, weight.group_size, weight.scales)
    else:
        out = torch._weight_int8pack_mm(flat, weight.packed, weight.scales)
    if x.dim() != 2:
        out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias

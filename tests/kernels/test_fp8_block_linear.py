"""Block-scaled fp8 GEMM (W8A16, Triton) against `fp8_block_linear_ref`, and its dispatch."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.fp8_block_linear import block_scale_shape, dequantize_fp8_blocks, fp8_block_linear_ref


def _case(m: int, n: int, k: int, block: tuple[int, int], dtype: torch.dtype, *, bias: bool = True, seed: int = 0):
    """Rows of `x` in `dtype`; an e4m3 weight `[n, k]` with random fp32 block scales (a different one each block,
    so a scale read for the wrong block shows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w8 = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(*block_scale_shape(n, k, block), generator=g) * 1e-3 + 1e-4
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w8, scale, b


def _on_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [t.to(DEVICE) if t is not None else None for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k", "block"), [
    (1, 200, 300, (128, 128)),  # N and K end mid-block (and mid-tile)
    (5, 256, 384, (128, 128)),  # whole blocks
    (20, 96, 160, (32, 64)),  # 17..64 rows' tiles; more blocks than tiles along N
    (70, 130, 200, (64, 32)),  # a prefill's tiles, 2 row tiles, partial blocks
])
def test_default_tiles_match_the_reference(dtype, m, n, k, block):
    from flotilla.kernels.triton_fp8_block_linear import fp8_block_linear

    x, w8, scale, bias = _case(m, n, k, block, dtype)
    out = fp8_block_linear(*_on_device(x, w8, scale), block, *_on_device(bias))
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), fp8_block_linear_ref(x, w8, scale, block, bias)) < tolerance(dtype)


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("split_k", [1, 3])
def test_each_k_step_takes_its_blocks_scale(split_k, swap_ab):
    """Tiles smaller than the blocks (16 x 32 steps in 32 x 64 blocks), K ranges of whole steps, either operand
    order; no bias; `x` with a leading batch dimension."""
    from flotilla.kernels.triton_fp8_block_linear import BlockGemmConfig, fp8_block_linear

    x, w8, scale, _ = _case(6, 72, 200, (32, 64), torch.float32, bias=False, seed=1)
    cfg = BlockGemmConfig(block_m=16, block_n=16, block_k=32, split_k=split_k, num_warps=4, num_stages=2,
                          swap_ab=swap_ab)
    out = fp8_block_linear(*_on_device(x.reshape(2, 3, 200), w8, scale), (32, 64), config=cfg)
    assert out.shape == (2, 3, 72)
    assert rel_err(out.cpu().reshape(6, 72), fp8_block_linear_ref(x, w8, scale, (32, 64))) < 1e-5


def test_default_config_splits_k_where_decode_tiles_are_few():
    """Llama-3.1-8B's o_proj at one row: 64 tiles of 64 outputs on 132 SMs, K cut in 5 ranges; gate/up's 448 tiles
    fill the SMs alone; a prefill never splits; the weight is the MMA's wide side up to 16 rows; tiles shrink to fit
    smaller blocks."""
    from flotilla.kernels.triton_fp8_block_linear import default_config

    block = (128, 128)
    assert default_config(1, 4096, 4096, block, 132).split_k == 5
    assert default_config(16, 4096, 4096, block, 132).swap_ab and not default_config(17, 4096, 4096, block, 132).swap_ab
    assert default_config(16, 28672, 4096, block, 132).split_k == 1
    assert default_config(512, 4096, 4096, block, 132).split_k == 1
    small = default_config(64, 4096, 4096, (32, 64), 132)
    assert (small.block_n, small.block_k) == (32, 64)


def test_unsupported_blocks_stay_on_the_reference():
    """Blocks the tiles cannot divide (not a power of two, or under 16) are not the kernel's; the dispatch computes
    the reference for them, and on the CPU for every block."""
    from flotilla.kernels.triton_fp8_block_linear import supported

    x, w8, scale, bias = _case(3, 40, 90, (24, 48), torch.float32, seed=2)
    assert not supported(x, w8, scale, (24, 48)) and not supported(x, w8, scale[:, :1], (8, 128))
    assert supported(x, w8, torch.ones(block_scale_shape(40, 90, (16, 32))), (16, 32))
    assert torch.equal(dispatch.fp8_block_linear(x, w8, scale, (24, 48), bias),
                       fp8_block_linear_ref(x, w8, scale, (24, 48), bias))  # fmt: skip
    dense = x @ dequantize_fp8_blocks(w8, scale, (24, 48)).t() + bias
    assert rel_err(dispatch.fp8_block_linear(x, w8, scale, (24, 48), bias), dense) < 1e-6


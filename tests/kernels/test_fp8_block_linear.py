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



class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch's choice (and, under the interpreter, its kernels) on the
    CPU."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


@pytest.fixture
def h100_shapes(monkeypatch):
    """The GEMV launchers' SM count and card for a fake CUDA tensor (132 SMs, DEFAULT's tables)."""
    from flotilla.kernels import triton_fp8_row_gemv, triton_gemv

    for mod in (triton_fp8_row_gemv, triton_gemv):
        monkeypatch.setattr(mod, "device_sms", lambda t: 132)
        monkeypatch.setattr(mod, "device_card", lambda t: None)


@pytest.mark.usefixtures("h100_shapes")
def test_decode_rows_take_the_per_channel_gemvs_block_forms(monkeypatch):
    """`dispatch.fp8_block_kernel`: one row the one-row fp8 GEMV's block form (FLOTILLA_FP8_ROW_GEMV on, bf16/fp16),
    2..16 rows (and one row where the row GEMV is off or does not take the row) the <=16-row GEMV's, the GEMM
    above and with FLOTILLA_FP8_GEMV=0, the reference off CUDA and for blocks the kernels do not take."""
    x, w8, scale, bias = _case(17, 64, 256, (32, 32), torch.bfloat16)

    def kernel(rows: int, *, dtype: torch.dtype = torch.bfloat16, block: tuple[int, int] = (32, 32)) -> str:
        return dispatch.fp8_block_kernel(x[:rows].to(dtype).as_subclass(_FakeCuda), w8, scale, block, bias)

    assert [kernel(m) for m in (1, 2, 16, 17)] == ["row_gemv", "gemv", "gemv", "gemm"]
    assert kernel(1, dtype=torch.float32) == "gemv"  # the row GEMV reads 16-bit activations only
    assert kernel(1, block=(24, 32)) == "ref" and dispatch.fp8_block_kernel(x[:1], w8, scale, (32, 32)) == "ref"
    monkeypatch.setattr(dispatch, "FP8_ROW_GEMV", False)
    assert kernel(1) == "gemv"
    monkeypatch.setattr(dispatch, "FP8_GEMV_ENABLED", False)
    assert kernel(1) == "gemm" and kernel(16) == "gemm"


@pytest.mark.usefixtures("h100_shapes")
def test_fused_one_row_seams_never_take_block_scales():
    """The one-row fp8 GEMV's gated and qkv-rope seams read one scale a row: a block layer's scales are not that,
    even where their count equals the rows' (an [64, 256] weight in 16 x 16 blocks has 4 x 16 = 64 scales)."""
    x, w8, scale, _ = _case(1, 64, 256, (16, 16), torch.bfloat16)
    fake = x.as_subclass(_FakeCuda)
    assert scale.numel() == w8.shape[0]
    assert not dispatch.fp8_gated_gemv_takes(fake, w8, scale, None)
    assert not dispatch.fp8_qkv_rope_takes(fake, w8, scale, None, 32)
    rows = torch.ones(64, 1)  # the per-channel scales of the same weight: taken
    assert dispatch.fp8_gated_gemv_takes(fake, w8, rows, None) and dispatch.fp8_qkv_rope_takes(fake, w8, rows, None,
                                                                                                 32)  # fmt: skip


@pytest.mark.usefixtures("h100_shapes")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "block"), [
    (1, 200, 304, (128, 128)),  # N and K end mid-block; the row GEMV's masked (uneven) K steps
    (1, 96, 1024, (32, 64)),  # tiles cut to the 32-row blocks, 512-wide steps over 8 k-blocks
    (3, 200, 300, (128, 128)),  # the <=16-row GEMV's FMA path, partial blocks
    (16, 136, 384, (64, 128)),  # its dot path (rows padded to 16), split K over 12 steps
])
def test_decode_kernels_through_the_dispatch_match_the_reference(dtype, m, n, k, block):
    """`dispatch.fp8_block_linear` at 1, 3 and 16 rows on CUDA (a fake CUDA tensor under the interpreter) against
    the reference: each activation (or dot step) scaled by its own block's scale."""
    x, w8, scale, bias = _case(m, n, k, block, dtype)
    xs = x.to(DEVICE)
    if not xs.is_cuda:
        xs = xs.as_subclass(_FakeCuda)
    assert dispatch.fp8_block_kernel(xs, *_on_device(w8, scale), block) == ("row_gemv" if m == 1 else "gemv")
    out = dispatch.fp8_block_linear(xs, *_on_device(w8, scale), block, *_on_device(bias))
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out.cpu(), fp8_block_linear_ref(x, w8, scale, block, bias)) < tolerance(dtype)


@pytest.mark.parametrize(("prefetch", "block_k", "pdl"), [(1, 64, False), (2, 128, False), (3, 32, True)])
def test_row_gemv_block_steps_prefetch_and_pdl(prefetch, block_k, pdl):
    """The one-row kernel's block form at each prefetch depth, K steps narrower and wider than the 64-wide blocks,
    even and masked K, the PDL code path (without griddepcontrol: the interpreter's); fp16 (exact to rounding)."""
    from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_block

    for k in (384, 200):
        x, w8, scale, bias = _case(1, 72, k, (16, 64), torch.float16, seed=3)
        out = fp8_row_gemv_block(*_on_device(x, w8, scale), (16, 64), *_on_device(bias), pdl=pdl, pdl_gdc=False,
                                 block_n=32, block_k=block_k, prefetch=prefetch)  # fmt: skip
        assert rel_err(out.cpu(), fp8_block_linear_ref(x, w8, scale, (16, 64), bias)) < 1e-3


@pytest.mark.parametrize(("use_dot", "split_k", "block_k"), [(False, 1, 256), (False, 2, 64), (True, 3, 32)])
def test_gemv_block_paths_and_split_k(use_dot, split_k, block_k):
    """The <=16-row GEMV's block form: FMA steps spanning several k-blocks or inside one, the dot path with steps
    inside one, split-K partials; fp32 activations (exact to fp32 rounding), 5 rows, partial blocks."""
    from flotilla.kernels.triton_gemv import fp8_gemv_block

    x, w8, scale, bias = _case(5, 80, 400, (32, 64), torch.float32, seed=4)
    out = fp8_gemv_block(*_on_device(x, w8, scale), (32, 64), *_on_device(bias), use_dot=use_dot, split_k=split_k,
                         block_k=block_k, block_n=16 if use_dot else 8)  # fmt: skip
    assert rel_err(out.cpu(), fp8_block_linear_ref(x, w8, scale, (32, 64), bias)) < 1e-5

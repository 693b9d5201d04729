"""Small-batch GEMV (Triton) against `gemv_ref`, and its shapes-only launch heuristic."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, linear_case, rel_err, tolerance

from flotilla.kernels.linear import gemv_ref

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("split_k", [1, 3])
def test_fma_path_matches_reference_on_ragged_tiles(dtype, m, split_k):
    """N = 40 and K = 200 end mid-tile (16 x 64 tiles); with split-K the last K range is ragged too
    and the partials meet in the reduce kernel, which adds the bias."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, bias = linear_case(m, 40, 200, dtype, bias=True)
    out = gemv(x, weight, bias, block_n=16, block_k=64, split_k=split_k, use_dot=False)
    assert out.dtype == dtype and out.shape == (m, 40)
    assert rel_err(out, gemv_ref(x, weight, bias)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,split_k", [(2, 1), (8, 2)])
def test_dot_path_matches_reference_with_the_batch_padded_to_16(dtype, m, split_k):
    """The swap-AB `tl.dot` path: weight tile as the MMA's rows, the batch padded to 16 columns."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, bias = linear_case(m, 40, 200, dtype, seed=1, bias=True)
    out = gemv(x, weight, bias, block_n=16, block_k=32, split_k=split_k, use_dot=True)
    assert rel_err(out, gemv_ref(x, weight, bias)) < tolerance(dtype)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_default_config_without_bias(m):
    """No knobs given: the heuristic's tiles (one masked K tile here) and no bias."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, _ = linear_case(m, 24, 72, torch.float32, bias=False, seed=2)
    assert rel_err(gemv(x, weight), gemv_ref(x, weight)) < 1e-5


def test_more_splits_than_k_tiles_launches_only_the_nonempty_ranges():
    """split_k = 8 over 3 K tiles: three ranges of one tile each; the result is still exact."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, bias = linear_case(2, 20, 150, torch.float32, seed=3, bias=True)
    out = gemv(x, weight, bias, block_n=8, block_k=64, split_k=8)
    assert rel_err(out, gemv_ref(x, weight, bias)) < 1e-5


def test_leading_dims_fp16_and_strided_rows():
    """`[B, T, K]` input as nn.Linear takes it; fp16; rows of `x` that are a view with a row stride."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, bias = linear_case(6, 33, 96, torch.float16, seed=4, bias=True)
    x3 = x.view(2, 3, 96)
    out = gemv(x3, weight, bias, block_n=16, block_k=32)
    assert out.shape == (2, 3, 33) and out.dtype == torch.float16
    assert rel_err(out, gemv_ref(x3, weight, bias)) < tolerance(torch.float16)
    wide = torch.randn(3, 200, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    xs = wide[:, 50:146]  # row stride 200
    assert rel_err(gemv(xs, weight.float(), block_n=16, block_k=32), gemv_ref(xs, weight.float())) < 1e-5


def test_empty_batch_gives_an_empty_output():
    from flotilla.kernels.triton_gemv import gemv

    x, weight, _ = linear_case(1, 16, 32, torch.float32, bias=True)
    assert gemv(x[:0], weight).shape == (0, 16)


LLAMA_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate_up, down


@pytest.mark.parametrize("n,k", LLAMA_8B)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_heuristic_fills_an_h200_without_split_k_for_llama_8b(n, k, m):
    """On 132 SMs every Llama-3.1-8B projection gets >= 2 programs per SM from its rows alone (no
    reduce kernel), and the FMA accumulator stays within 64 fp32 registers a thread."""
    from flotilla.kernels.triton_gemv import default_config

    cfg = default_config(m, n, k, 132)
    assert not cfg.use_dot and cfg.split_k == 1
    assert -(-n // cfg.block_n) >= 2 * 132
    assert m * cfg.block_n * cfg.block_k <= 64 * 32 * cfg.num_warps


def test_heuristic_splits_k_when_rows_are_few_and_keeps_given_knobs():
    """A 1,024-row projection splits K (>= 4 tiles a range); M > 4 takes the dot path; given knobs stay."""
    from flotilla.kernels.triton_gemv import default_config

    small = default_config(1, 1024, 4096, 132)
    assert small.split_k == 2 and small.block_n == 8
    assert default_config(1, 1024, 1024, 132).split_k == 1  # only 2 tiles of 512: nothing to split
    assert default_config(8, 4096, 4096, 132).use_dot
    cfg = default_config(1, 4096, 4096, 132, block_n=32, split_k=4, num_stages=3)
    assert (cfg.block_n, cfg.split_k, cfg.num_stages) == (32, 4, 3)

"""Int4 W4A16 GEMV (Triton) against `packed_int_linear_ref`, and the dispatch's choice of int4 path."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, int4_weight, rel_err, tolerance

from flotilla.kernels.packed_int_linear import packed_int_linear_ref


def _check(m: int, n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, bias: bool, **knobs) -> None:
    from flotilla.kernels.triton_int4_gemv import int4_gemv

    g = torch.Generator().manual_seed(m * 1000 + n + k)
    packed, scales, zeros = int4_weight(n, k, group, g, dtype, symmetric)
    x = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, 4, group, b.float() if bias else None)
    out = int4_gemv(x.to(DEVICE), packed.to(DEVICE), scales.to(DEVICE), None if symmetric else zeros.to(DEVICE),
                    group, b.to(DEVICE) if bias else None, **knobs)  # fmt: skip
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "m,n,k,group,symmetric,bias",
    [
        (1, 40, 256, 128, True, False),  # one decode row, symmetric (no zero points read), N not a tile multiple
        (2, 24, 384, 64, False, True),  # asymmetric zero points, a bias, K not a power of two
        (3, 16, 256, 256, False, False),  # rows padded to 4, one group per row
        (1, 64, 512, 128, True, False),  # whole tiles everywhere: the unmasked loads
        (2, 32, 1024, 128, False, True),  # the same at two rows, zero points and a bias
    ],
)
def test_int4_gemv_matches_reference(dtype, m, n, k, group, symmetric, bias):
    _check(m, n, k, group, dtype, symmetric, bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "m,n,k,group,symmetric,bias",
    [
        (1, 40, 256, 128, True, False),  # one row on the tensor cores (padded to 16), N not a tile multiple
        (5, 24, 384, 64, False, True),  # the default path from 3 rows: zero points, a bias
        (16, 16, 512, 256, True, False),  # a full 16-row tile, wide groups
        (4, 32, 256, 128, False, False),  # whole row tiles: the unmasked weight loads
    ],
)
def test_int4_gemv_dot_matches_reference(dtype, m, n, k, group, symmetric, bias):
    _check(m, n, k, group, dtype, symmetric, bias, use_dot=True, block_n=16)


@pytest.mark.parametrize(
    "knobs",
    [
        {"split_k": 3, "block_w": 16},  # three word ranges, partials + the fixed-order reduce (with a bias)
        {"block_n": 8, "block_w": 32, "num_warps": 2},  # a step spanning a group boundary mid-tile
        {"use_dot": True, "block_n": 16, "split_k": 3},  # tensor cores, three group ranges
    ],
)
def test_int4_gemv_split_and_tiles(knobs):
    _check(2, 40, 512, 128, torch.float32, False, True, **knobs)


@pytest.mark.parametrize("use_dot", [False, True])
def test_int4_gemv_split_fixup_equals_reduce_launch(monkeypatch, use_dot):
    """Split-K summed by the last program of each row tile (arrival counters) gives the bits of the
    separate reduce launch (taken when no counters are available), and leaves the counters at zero."""
    from flotilla.kernels import triton_int4_gemv
    from flotilla.kernels.triton_int4_gemv import int4_gemv

    g = torch.Generator().manual_seed(11)
    packed, scales, zeros = int4_weight(48, 512, 128, g, torch.float32)
    x = torch.randn(2, 512, generator=g)
    bias = torch.randn(48, generator=g)
    args = (x.to(DEVICE), packed.to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE), 128, bias.to(DEVICE))
    knobs = {"split_k": 4, "block_n": 16, "use_dot": use_dot} | ({} if use_dot else {"block_w": 16})
    fixed = int4_gemv(*args, **knobs)
    assert not triton_int4_gemv._COUNTERS[args[0].device].any()
    monkeypatch.setattr(triton_int4_gemv, "_COUNTER_SLOTS", 1)
    monkeypatch.setattr(triton_int4_gemv, "_COUNTERS", {})
    assert torch.equal(fixed, int4_gemv(*args, **knobs))
    ref = packed_int_linear_ref(x, packed, scales, zeros, 4, 128, bias)
    assert rel_err(fixed.cpu(), ref) < tolerance(torch.float32)


def test_int4_gemv_split_is_deterministic():
    """Split-K partials are summed in a fixed order: the same call gives the same bits twice."""
    from flotilla.kernels.triton_int4_gemv import int4_gemv

    g = torch.Generator().manual_seed(7)
    packed, scales, zeros = int4_weight(16, 512, 128, g, torch.float32)
    x = torch.randn(1, 512, generator=g)
    args = (x.to(DEVICE), packed.to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE), 128)
    assert torch.equal(int4_gemv(*args, split_k=4, block_w=16), int4_gemv(*args, split_k=4, block_w=16))


def test_int4_default_config_covers_llama_8b():
    """Llama-3.1-8B on 132 SMs: the tensor-core path with the measured tiles, split-K where the row tiles
    are fewer than the SMs; a small projection (a tensor-parallel shard) splits K."""
    from flotilla.kernels.triton_int4_gemv import default_config

    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
        cfg = default_config(1, n, k, 132)  # the tensor-core path, 128-row tiles, 3 stages (H200 grid)
        assert cfg.use_dot and cfg.block_n == 128 and cfg.num_stages == 3, (n, k, cfg)
        assert -(-n // cfg.block_n) * cfg.split_k >= 132, (n, k, cfg)  # split-K fills the SMs
    assert default_config(1, 28672, 4096, 132).split_k == 1  # 224 row tiles already do
    assert default_config(1, 512, 4096, 132).split_k > 1
    assert default_config(2, 4096, 4096, 132).use_dot and default_config(16, 4096, 4096, 132).use_dot
    assert not default_config(4, 4096, 4096, 132, group_size=96).use_dot  # not a power of two: FMA
    assert not default_config(1, 4096, 4096, 132, use_dot=False).use_dot  # a given knob is kept


def test_int4_gemv_tiles_from_the_environment():
    """FLOTILLA_INT4_GEMV_TILES: tiles for every shape and per `NxK`, one-row calls only."""
    from flotilla.kernels import triton_int4_gemv

    tiles = triton_int4_gemv._parse_tiles("use_dot=0,block_n=32, block_w=128;4096x4096:use_dot=1,block_n=128")
    assert tiles == {None: {"use_dot": 0, "block_n": 32, "block_w": 128}, (4096, 4096): {"use_dot": 1, "block_n": 128}}
    assert triton_int4_gemv._parse_tiles("") == {}

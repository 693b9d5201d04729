"""The wide int4 W4A16 GEMV (16-byte weight loads, 1-4 rows) against `packed_int_linear_ref`, its launch
choices, and the dispatch's switch to it (FLOTILLA_INT4_GEMV_WIDE)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import DEVICE, int4_case, int4_weight, rel_err, tolerance

from flotilla.kernels.packed_int_linear import packed_int_linear_ref


def _check(m: int, n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, bias: bool, **knobs) -> None:
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(m, n, k, group, dtype, symmetric, bias)
    out = int4_gemv_wide(*args, **knobs)
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "m,n,k,group,symmetric,bias,knobs",
    [
        (1, 40, 256, 128, True, False, {}),  # one decode row, symmetric (no zero points read), N not a tile multiple
        (2, 24, 384, 32, False, True, {}),  # group 32 (one scale a chunk), zero points, a bias, K not a power of two
        (3, 32, 1024, 128, True, False, {"block_n": 16, "block_w": 64}),  # three rows, whole tiles (unmasked loads)
        (4, 64, 512, 128, False, True, {"block_n": 32, "block_w": 32}),  # four rows, zero points, a bias, unmasked
        (1, 48, 768, 32, False, False, {"block_n": 16, "block_w": 32, "num_stages": 1}),  # steps across groups
    ],
)
def test_int4_gemv_wide_matches_reference(dtype, m, n, k, group, symmetric, bias, knobs):
    _check(m, n, k, group, dtype, symmetric, bias, **knobs)


def test_int4_gemv_wide_fp16_activations():
    """fp16 activations: their 16-bit halves are converted, not shifted into an fp32 (bf16's path)."""
    _check(2, 32, 512, 128, torch.float16, False, True, block_n=16, block_w=32)


@pytest.mark.parametrize(
    "knobs",
    [
        {"split_k": 3, "block_w": 16, "block_n": 16},  # three word ranges, the last ragged
        {"split_k": 2, "block_w": 32, "block_n": 16},  # two whole ranges (unmasked)
    ],
)
def test_int4_gemv_wide_split_k(knobs):
    _check(2, 40, 1024, 128, torch.float32, False, True, **knobs)


def test_int4_gemv_wide_split_fixup_equals_reduce_launch(monkeypatch):
    """Split-K summed by the last program of each row tile (arrival counters) gives the bits of the separate
    reduce launch (taken when no counters are available), and leaves the counters at zero."""
    from flotilla.kernels import triton_int4_gemv
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(1, 48, 512, 128, torch.float32, False, True, seed=11)
    knobs = {"split_k": 4, "block_n": 16, "block_w": 16}
    fixed = int4_gemv_wide(*args, **knobs)
    assert not triton_int4_gemv._COUNTERS[args[0].device].any()
    monkeypatch.setattr(triton_int4_gemv, "_COUNTER_SLOTS", 1)
    monkeypatch.setattr(triton_int4_gemv, "_COUNTERS", {})
    assert torch.equal(fixed, int4_gemv_wide(*args, **knobs))
    assert rel_err(fixed.cpu(), ref) < tolerance(torch.float32)


def test_int4_gemv_wide_strided_rows():
    """Rows that are not contiguous (a slice of a wider tensor) read the same as a contiguous copy."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(2, 32, 256, 128, torch.bfloat16, True, False, seed=3)
    wide = torch.zeros(2, 512, dtype=torch.bfloat16, device=DEVICE)
    wide[:, 128:384] = args[0]
    out = int4_gemv_wide(wide[:, 128:384], *args[1:], block_n=16, block_w=32)
    assert torch.equal(out, int4_gemv_wide(*args, block_n=16, block_w=32))
    assert rel_err(out.cpu(), ref) < tolerance(torch.bfloat16)
    flat = torch.zeros(257 + 256, dtype=torch.bfloat16, device=DEVICE)  # one row 2 bytes past an 8-byte boundary
    flat[1:257] = args[0][0]
    one = (flat[1:257][None, :],) + args[1:]
    assert torch.equal(int4_gemv_wide(*one, block_n=16, block_w=32), int4_gemv_wide(args[0][:1], *args[1:],
                                                                                     block_n=16, block_w=32))


def test_wide_config_takes_the_measured_table(monkeypatch):
    """The measured table (what an unset FLOTILLA_INT4_GEMV_WIDE_CONFIG gives): Llama-3.1-8B's projections take
    the measured one-row winners (128-word tiles, one stage; split-K 2 on qkv and o, 4 on down; layout 1),
    other shapes the table's every-shape entry with split-K by the lead's rule; given knobs are kept; groups must be
    whole 32-input chunks."""
    from flotilla.kernels import triton_int4_gemv, triton_int4_gemv_wide
    from flotilla.kernels.card_tables import DEFAULT
    from flotilla.kernels.triton_int4_gemv_wide import MEASURED_TILES, wide_config, wide_supported

    monkeypatch.setattr(triton_int4_gemv_wide, "_WIDE_TILES", triton_int4_gemv._parse_tiles(MEASURED_TILES[DEFAULT]))
    # (block_n, num_warps, split_k): gate_up at 2 warps and down at 32 rows since session 20's in-engine sweep
    tiles = {(6144, 4096): (16, 4, 2), (4096, 4096): (16, 4, 2), (28672, 4096): (16, 2, 1), (4096, 14336): (32, 4, 4)}
    for (n, k), (block_n, warps, split_k) in tiles.items():
        cfg = wide_config(1, n, k, 132)
        assert (cfg.block_n, cfg.block_w, cfg.num_warps, cfg.num_stages, cfg.split_k) == (block_n, 128, warps, 1,
                                                                                            split_k)
        assert cfg.layout == 1  # the row-contiguous word tile, measured there (session 16)
    other = wide_config(1, 2048, 8192, 132)  # 128 row tiles: split by the lead's rule
    assert (other.block_n, other.block_w, other.num_stages, other.split_k, other.layout) == (16, 128, 1, 4, 0)
    assert wide_config(1, 4096, 4096, 132, block_n=64, split_k=1).block_n == 64
    assert wide_supported(1, 4096, 128) and wide_supported(4, 4096, 32)
    assert not wide_supported(5, 4096, 128) and not wide_supported(1, 4096, 16) and not wide_supported(1, 4096, 96)


def test_one_row_takes_the_wide_gemv_by_default():
    """FLOTILLA_INT4_GEMV_WIDE, read at import: unset, one-row int4 calls take the wide GEMV; "1" up to 4 rows;
    "0" none."""
    code = "from flotilla.kernels import dispatch; print(dispatch.INT4_GEMV_WIDE_ROWS)"
    rows = {}
    for value in (None, "0", "1"):
        env = {k: v for k, v in os.environ.items() if k != "FLOTILLA_INT4_GEMV_WIDE"}
        if value is not None:
            env["FLOTILLA_INT4_GEMV_WIDE"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        rows[value] = int(out.stdout.strip())
    assert rows == {None: 1, "0": 0, "1": 4}


def test_wide_tiles_from_the_environment(monkeypatch):
    """FLOTILLA_INT4_GEMV_WIDE_CONFIG (parsed at import): knobs for every shape and per `NxK`."""
    from flotilla.kernels import triton_int4_gemv, triton_int4_gemv_wide

    tiles = triton_int4_gemv._parse_tiles("block_n=16,block_w=64;4096x14336:split_k=4,num_stages=2")
    monkeypatch.setattr(triton_int4_gemv_wide, "_WIDE_TILES", tiles)
    cfg = triton_int4_gemv_wide.wide_config(1, 4096, 14336, 132)
    assert (cfg.block_n, cfg.block_w, cfg.split_k, cfg.num_stages) == (16, 128, 4, 2)  # per shape wins whole
    cfg = triton_int4_gemv_wide.wide_config(1, 6144, 4096, 132)
    assert (cfg.block_n, cfg.block_w) == (16, 64)


@pytest.mark.gpu
def test_int4_gemv_wide_asm_matches_plain():
    """The PTX nibble path (lop3 by inline asm) and the plain Triton one give the same bits."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(1, 4096, 4096, 128, torch.bfloat16, True, False, seed=5)
    out = int4_gemv_wide(*args, use_asm=True)
    assert torch.equal(out, int4_gemv_wide(*args, use_asm=False))
    assert rel_err(out.cpu(), ref) < tolerance(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (4, 4096, 14336)])  # qkv; down at 4 rows (split-K by default)
def test_int4_gemv_wide_llama_shapes(m, n, k):
    """Llama-3.1-8B projections at the default launch, symmetric and asymmetric."""
    _check(m, n, k, 128, torch.bfloat16, True, False)
    _check(m, n, k, 128, torch.bfloat16, False, True)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 5])  # wide, wide, the tensor-core GEMV (more than 4 rows)
def test_dispatch_int4_gemv_wide(monkeypatch, m):
    """FLOTILLA_INT4_GEMV_WIDE=1 (the module global at 4 rows) routes 1-4 row calls to the wide GEMV."""
    from flotilla.kernels import dispatch, triton_int4_gemv_wide

    called = []
    real = triton_int4_gemv_wide.int4_gemv_wide
    monkeypatch.setattr(triton_int4_gemv_wide, "int4_gemv_wide", lambda *a, **kw: called.append(1) or real(*a, **kw))
    monkeypatch.setattr(dispatch, "INT4_GEMV_WIDE_ROWS", 4)
    g = torch.Generator().manual_seed(m)
    packed, scales, zeros = int4_weight(96, 512, 128, g, torch.bfloat16)
    x = torch.randn(m, 512, generator=g).bfloat16()
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, 4, 128)
    out = dispatch.packed_int_linear(*(t.to(DEVICE) for t in (x, packed, scales, zeros)), 4, 128)
    assert rel_err(out.cpu(), ref) < tolerance(torch.bfloat16)
    assert called == ([1] if m <= 4 else [])

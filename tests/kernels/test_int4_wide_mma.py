"""The wide int4 GEMV's tensor-core step (FLOTILLA_INT4_WIDE_MMA, `triton_int4_mma.py`) under the interpreter: its
plain-Triton stand-in through the real launch plumbing (row halves, both fragments, the diagonal read, split-K, the PDL
peel, the fused forms) against `packed_int_linear_ref` and the FMA step; which launches it takes; the switch. The
PTX itself compiles for sm_90 in test_hopper_compile.py (instruction counts: bench/sass_loop.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import int4_case, rel_err, tolerance

from flotilla.kernels.switches import FLAG_VALUES, parse_choice


@pytest.mark.parametrize(
    "n,k,symmetric,bias,knobs",
    [
        (40, 1024, True, False, {"block_n": 16, "block_w": 64, "layout": 1}),  # N not a tile multiple (masked rows)
        (32, 1024, False, True, {"block_n": 8, "block_w": 32, "layout": 1}),  # zero points, a bias, whole tiles
        (48, 2048, False, False, {"block_n": 16, "block_w": 32, "layout": 1, "split_k": 3}),  # ranges, the last ragged
    ],
)
def test_mma_step_matches_reference(n, k, symmetric, bias, knobs):
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, launch_constexprs, wide_config

    args, ref = int4_case(1, n, k, 128, torch.bfloat16, symmetric, bias, seed=n)
    cfg = wide_config(1, n, k, 4, **knobs)
    assert launch_constexprs(cfg, args[0], n, k // 8, args[3], args[5], 128, "", True, False, mma=True)["MMA"]
    out = int4_gemv_wide(*args, mma=True, **knobs)
    fma = int4_gemv_wide(*args, mma=False, **knobs)
    assert out.shape == (1, n) and rel_err(out.float().cpu(), ref) < tolerance(torch.bfloat16)
    # the same exact products summed in another order: within bf16's last place of the FMA step's output
    assert torch.allclose(out.float(), fma.float(), rtol=1e-2, atol=1e-2)


def test_mma_step_pdl_peel_is_the_loop():
    """The peeled first step (PDL, without griddepcontrol under the interpreter) gives the plain launch's bits."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, _ = int4_case(1, 32, 1024, 128, torch.bfloat16, False, False, seed=5)
    knobs = {"block_n": 16, "block_w": 32, "layout": 1, "split_k": 2, "mma": True}
    plain = int4_gemv_wide(*args, pdl="", **knobs)
    peeled = int4_gemv_wide(*args, pdl="top", pdl_gdc=False, **knobs)
    assert torch.equal(plain, peeled)


def test_mma_step_fused_gated():
    """The gated form (gate rows the first half of a tile, up rows the second: the step's two row sets) with the MMA
    step equals it with the FMA step within bf16 rounding."""
    from flotilla.kernels.triton_int4_gemv_fused import fuses_gated, int4_gemv_wide_gated

    args, _ = int4_case(1, 64, 1024, 128, torch.bfloat16, True, False, seed=7)
    assert fuses_gated(*args)
    knobs = {"block_n": 16, "block_w": 32, "layout": 1, "pdl": ""}
    on = int4_gemv_wide_gated(*args, mma=True, **knobs)
    off = int4_gemv_wide_gated(*args, mma=False, **knobs)
    assert torch.allclose(on.float(), off.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "rows,x_kind,group,block_n,block_w,layout,takes",
    [
        (1, 0, 128, 16, 128, 1, True),  # Llama-3.1-8B's one-row launches
        (1, 0, 256, 8, 256, 1, True),
        (2, 0, 128, 16, 128, 1, False),  # two rows: the FMA step
        (1, 1, 128, 16, 128, 1, False),  # fp16 activations
        (1, 0, 64, 16, 128, 1, False),  # four lanes' chunks would span two groups
        (1, 0, 128, 16, 128, 0, False),  # layout 0
        (1, 0, 128, 16, 8, 1, False),  # fewer than 4 chunks a row
    ],
)
def test_mma_takes(rows, x_kind, group, block_n, block_w, layout, takes):
    from flotilla.kernels.triton_int4_mma import mma_takes

    assert mma_takes(rows, x_kind, group, block_n, block_w, layout) is takes


def test_mma_switch_read_once():
    """FLOTILLA_INT4_WIDE_MMA: off unset, an on/off flag, a typo refused at import naming the variable."""
    from flotilla.kernels import triton_int4_gemv_wide

    assert triton_int4_gemv_wide.WIDE_MMA == parse_choice("FLOTILLA_INT4_WIDE_MMA",
                                                          os.environ.get("FLOTILLA_INT4_WIDE_MMA", "").lower(),
                                                          FLAG_VALUES, False)  # fmt: skip
    code = "import flotilla.kernels.triton_int4_gemv_wide"
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FLOTILLA_INT4_WIDE_MMA": "maybe"},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "FLOTILLA_INT4_WIDE_MMA='maybe'" in bad.stderr

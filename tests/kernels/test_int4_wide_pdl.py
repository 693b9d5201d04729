"""The wide int4 GEMV launched by programmatic dependent launch (FLOTILLA_INT4_WIDE_PDL, `triton_int4_gemv_wide.py`):
the peeled first step (its words and scales loaded before the wait) gives the plain loop's bits, the switch reads the
environment and stays off where PDL cannot run, the PDL launches' own tile table, and (on a Hopper GPU) the chain
RMSNorm -> int4 GEMV -> SiLU-and-mul -> int4 GEMV by PDL in a CUDA graph equal to the plain launches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import DEVICE, int4_case, rel_err, tolerance


def _hopper() -> bool:
    return DEVICE.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


# (m, n, k, group, dtype, symmetric, bias, knobs): one step a range (the peel is the whole range), several steps,
# ragged rows (masked loads), split-K with a ragged last range of one step, zero points, four rows
CASES = [
    (1, 40, 256, 128, torch.bfloat16, True, False, {"block_n": 16, "block_w": 32}),
    (1, 48, 512, 128, torch.float32, False, True, {"block_n": 16, "block_w": 64}),  # one step = the whole range
    (2, 40, 640, 128, torch.float32, False, True, {"block_n": 16, "block_w": 16, "split_k": 3}),  # 32/32/16 words
    (1, 32, 1024, 128, torch.bfloat16, True, False, {"block_n": 16, "block_w": 32, "split_k": 2}),  # even, fixup
    (4, 32, 512, 32, torch.float16, False, False, {"block_n": 16, "block_w": 16}),
]


@pytest.mark.parametrize("trigger,layout", [("top", 0), ("late", 1)])
@pytest.mark.parametrize("m,n,k,group,dtype,symmetric,bias,knobs", CASES)
def test_peeled_first_step_is_bit_equal(trigger, layout, m, n, k, group, dtype, symmetric, bias, knobs):
    """The PDL variant loads the first step's words and scales before the wait and runs that step outside the loop
    (the same step function, the same order): the plain launch's bits, in either word layout. Under the interpreter
    without the griddepcontrol instructions (`pdl_gdc=False`); on a Hopper GPU with them, launched by PDL."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(m, n, k, group, dtype, symmetric, bias)
    plain = int4_gemv_wide(*args, pdl="", layout=layout, **knobs)
    peeled = int4_gemv_wide(*args, pdl=trigger, pdl_gdc=_hopper(), layout=layout, **knobs)
    assert torch.equal(peeled, plain)
    assert rel_err(peeled.cpu(), ref) < tolerance(dtype)


@pytest.mark.parametrize("m,n,k,group,dtype,symmetric,bias,knobs", CASES)
def test_row_layout_matches_main_layout(m, n, k, group, dtype, symmetric, bias, knobs):
    """LAYOUT 1 (the [rows, words] word tile, scales and zero points by PTX loads from clamped rows and groups) computes
    main's sums: bit-equal under the interpreter (the same fp32 operations; its sums do not depend on a layout), on a
    GPU within the reference tolerance (the final reduction over chunks may run in another order)."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    args, ref = int4_case(m, n, k, group, dtype, symmetric, bias, seed=2)
    main = int4_gemv_wide(*args, pdl="", **knobs)
    rows = int4_gemv_wide(*args, pdl="", layout=1, **knobs)
    assert rel_err(rows.cpu(), ref) < tolerance(dtype)
    if DEVICE.type != "cuda":
        assert torch.equal(rows, main)


def test_switch_values_and_typo():
    """FLOTILLA_INT4_WIDE_PDL, read at import: "0" off (""), unset or "1" "top" (the default since session 16),
    "late" "late"; a typo stops the import instead of benchmarking the wrong launch."""
    from flotilla.kernels import triton_int4_gemv_wide
    from flotilla.kernels.switches import parse_choice

    values = triton_int4_gemv_wide.WIDE_PDL_VALUES
    seen = {v: parse_choice("FLOTILLA_INT4_WIDE_PDL", v, values, "top") for v in ("", "0", "1", "late")}
    assert seen == {"": "top", "0": "", "1": "top", "late": "late"}
    assert seen[os.environ.get("FLOTILLA_INT4_WIDE_PDL", "").strip()] == triton_int4_gemv_wide.WIDE_PDL
    code = "import flotilla.kernels.triton_int4_gemv_wide"
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FLOTILLA_INT4_WIDE_PDL": "on"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "FLOTILLA_INT4_WIDE_PDL='on'" in bad.stderr


def test_default_launch_is_plain_where_pdl_cannot_run(monkeypatch):
    """With the switch on, a call launches by PDL only where `pdl_active` holds (FLOTILLA_PDL, sm_90+, one row): under
    the interpreter or on the CPU never, so the default launch there is the plain one."""
    from flotilla.kernels import triton_int4_gemv_wide

    seen = []
    real = triton_int4_gemv_wide._pdl_options
    monkeypatch.setattr(triton_int4_gemv_wide, "_pdl_options", lambda pdl, gdc: seen.append(pdl) or real(pdl, gdc))
    monkeypatch.setattr(triton_int4_gemv_wide, "WIDE_PDL", "top")
    args, _ = int4_case(1, 32, 256, 128, torch.bfloat16, True, False)
    triton_int4_gemv_wide.int4_gemv_wide(*args, block_n=16, block_w=32)
    assert seen == (["top"] if _hopper() and triton_int4_gemv_wide.pdl_active(args[0]) else [""])
    assert real("", True) == {}
    assert real("late", True) == {"PDL": True, "PDL_GDC": True, "TRIGGER_LATE": 1, "launch_pdl": True}
    assert real("top", False) == {"PDL": True, "PDL_GDC": False, "TRIGGER_LATE": 0}


def test_pdl_launches_take_their_own_table(monkeypatch):
    """FLOTILLA_INT4_WIDE_PDL_CONFIG (parsed at import): a PDL launch's knobs come from it first (per shape, then its
    every-shape entry), then from the plain table; plain launches never read it."""
    from flotilla.kernels import triton_int4_gemv, triton_int4_gemv_wide
    from flotilla.kernels.triton_int4_gemv_wide import wide_config

    parse = triton_int4_gemv._parse_tiles
    monkeypatch.setattr(triton_int4_gemv_wide, "_WIDE_TILES", parse("block_n=16,block_w=128,num_stages=1;"
                                                                     "4096x14336:block_n=16,split_k=4"))
    monkeypatch.setattr(triton_int4_gemv_wide, "_PDL_TILES",
                        parse("4096x4096:block_n=32,block_w=256,split_k=1,layout=1"))  # fmt: skip
    pdl = wide_config(1, 4096, 4096, 132, pdl=True)
    assert (pdl.block_n, pdl.block_w, pdl.split_k, pdl.layout) == (32, 256, 1, 1)
    plain = wide_config(1, 4096, 4096, 132)
    assert (plain.block_n, plain.block_w, plain.layout) == (16, 128, 0)
    assert wide_config(1, 4096, 4096, 132, layout=1).layout == 1
    down = wide_config(1, 4096, 14336, 132, pdl=True)  # not in the PDL table: the plain table's entry
    assert (down.block_n, down.split_k) == (16, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs sm_90 (griddepcontrol)")
@pytest.mark.parametrize("trigger", ["top", "late"])
def test_chain_by_pdl_in_a_graph_equals_plain(trigger):
    """RMSNorm -> int4 qkv-shaped GEMV -> SiLU-and-mul of a gate_up-shaped GEMV -> down-shaped GEMV, each kernel that
    can launched by PDL (FLOTILLA_PDL's one-row chain), replayed in a CUDA graph: the plain launches' bits."""
    from flotilla.kernels import pdl, triton_int4_gemv_wide
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_rmsnorm import rms_norm

    if not pdl.PDL_ENABLED:
        pytest.skip("FLOTILLA_PDL=0")

    def weight(n: int, k: int) -> tuple:  # random symmetric codes made on the GPU (no CPU reference: bits compared)
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), device=DEVICE, dtype=torch.int64).to(torch.int32)
        return (None, packed, (torch.rand(n, k // 128, device=DEVICE) * 0.004 + 0.001).bfloat16(), None, 128, None)

    qkv, gate_up, down = weight(6144, 4096), weight(2 * 14336, 4096), weight(4096, 14336)
    hidden = torch.randn(1, 4096, device=DEVICE, dtype=torch.bfloat16)
    norm_w = torch.rand(4096, device=DEVICE, dtype=torch.bfloat16) + 0.5

    def chain(mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        h = rms_norm(hidden, norm_w, 1e-5)[0]
        a = triton_int4_gemv_wide.int4_gemv_wide(h, *qkv[1:], pdl=mode)
        g = silu_and_mul(triton_int4_gemv_wide.int4_gemv_wide(h, *gate_up[1:], pdl=mode))
        return a, triton_int4_gemv_wide.int4_gemv_wide(g, *down[1:], pdl=mode)

    plain = chain("")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(trigger)  # compile and allocate the split-K counters outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(trigger)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], plain[0]) and torch.equal(outs[1], plain[1])

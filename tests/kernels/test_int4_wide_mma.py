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

    value = os.environ.get("FLOTILLA_INT4_WIDE_MMA", "").lower()
    assert parse_choice("FLOTILLA_INT4_WIDE_MMA", value, FLAG_VALUES, False) == triton_int4_gemv_wide.WIDE_MMA
    code = "import flotilla.kernels.triton_int4_gemv_wide"
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FLOTILLA_INT4_WIDE_MMA": "maybe"},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "FLOTILLA_INT4_WIDE_MMA='maybe'" in bad.stderr


class _Warp:
    """Runs the PTX subset of `STEP_ASM` / `DIAGONAL_ASM` in lockstep over 32 lanes (their registers: ints for
    .b32/.b64, np.float32 for .f32), `mma.sync.m16n8k16` by the PTX ISA's fragment layout (lane = 4 g + c: A's
    registers (row g, k 2c..2c+1), (g + 8, 2c..), (g, 2c+8..), (g + 8, 2c+8..); B's (k 2c.., column g), (k 2c+8..,
    g); C/D (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1); the lower element in the lower half)."""

    def __init__(self, operands: list[list]):
        self.regs = [{f"${i}": v for i, v in enumerate(lane)} for lane in operands]

    def value(self, lane: int, token: str):
        import numpy as np

        token = token.strip()
        if token in self.regs[lane]:
            return self.regs[lane][token]
        if token == "%laneid":
            return lane
        if token.startswith("0f"):
            return np.frombuffer(int(token[2:], 16).to_bytes(4, "little"), np.float32)[0]
        return int(token, 0)

    def run(self, asm: str) -> None:
        body = asm.strip()
        assert body[0] == "{" and body[-1] == "}"
        for line in body[1:-1].split(";"):
            line = line.strip()
            if line and not line.startswith(".reg"):
                self.step(line)

    def step(self, line: str) -> None:
        import re

        import numpy as np

        pred = None
        if line.startswith("@"):
            pred, line = line[1:].split(None, 1)
        op, rest = line.split(None, 1)
        if op.startswith("mma.sync"):
            return self.mma([g.split(",") for g in re.findall(r"\{([^}]*)\}", rest)])
        if op == "mov.b64":
            lo, hi, src = re.match(r"\{(\w+), (\w+)\}, (\S+)", rest).groups()
            for lane, regs in enumerate(self.regs):
                v = self.value(lane, src)
                regs[lo], regs[hi] = v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF
            return None
        dst, *args = [a.strip() for a in rest.split(",")]
        for lane, regs in enumerate(self.regs):
            if pred is not None and not regs[pred]:
                continue
            v = [self.value(lane, a) for a in args]
            if op in ("shr.u32",):
                r = (v[0] & 0xFFFFFFFF) >> v[1]
            elif op == "shl.b32":
                r = (v[0] << v[1]) & 0xFFFFFFFF
            elif op == "and.b32":
                r = v[0] & v[1]
            elif op == "add.u32":
                r = (v[0] + v[1]) & 0xFFFFFFFF
            elif op == "lop3.b32":
                assert v[3] == 0xEA  # (a & b) | c
                r = ((v[0] & 0xFFFFFFFF) & v[1]) | v[2]
            elif op == "prmt.b32":
                data = (v[0] & 0xFFFFFFFF) | (v[1] & 0xFFFFFFFF) << 32
                r = sum(((data >> (8 * ((v[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
            elif op in ("mov.u32", "mov.f32"):
                r = v[0]
            elif op == "add.f32":
                r = np.float32(v[0]) + np.float32(v[1])
            elif op == "fma.rn.f32":
                r = np.float32(np.float64(v[0]) * np.float64(v[1]) + np.float64(v[2]))
            elif op == "setp.eq.u32":
                r = v[0] == v[1]
            elif op == "selp.f32":
                r = v[0] if v[2] else v[1]
            else:
                raise AssertionError(op)
            regs[dst] = r
        return None

    def mma(self, groups: list[list[str]]) -> None:
        import numpy as np

        d, a, b, c = ([t.strip() for t in g] for g in groups)

        def bf16(bits: int) -> float:
            return float(np.frombuffer(((bits & 0xFFFF) << 16).to_bytes(4, "little"), np.float32)[0])

        A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        for lane in range(32):
            g, t = divmod(lane, 4)
            av = [self.value(lane, r) for r in a]
            bv = [self.value(lane, r) for r in b]
            cv = [self.value(lane, r) for r in c]
            for i, (row, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                A[row, k], A[row, k + 1] = bf16(av[i]), bf16(av[i] >> 16)
            for i, k in enumerate((2 * t, 2 * t + 8)):
                B[k, g], B[k + 1, g] = bf16(bv[i]), bf16(bv[i] >> 16)
            for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
                C[row, col] = cv[i]
        D = A @ B + C
        for lane in range(32):
            g, t = divmod(lane, 4)
            for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
                self.regs[lane][d[i]] = np.float32(D[row, col])


@pytest.mark.parametrize("symmetric", [True, False])
def test_step_ptx_on_a_warp_model(symmetric):
    """`STEP_ASM` then `DIAGONAL_ASM` run by a model of one warp (lane L: chunk L, 32 inputs, of two weight rows; four
    lanes a group of 128) give each row's dot with the activations: the diagonal trick, the nibble pairs against the
    permuted activation pairs, the zero-point MMA and the per-group scale, checked without a GPU."""
    import numpy as np

    from flotilla.kernels.triton_int4_mma import DIAGONAL_ASM, STEP_ASM

    rng = np.random.default_rng(3)
    k = 32 * 32
    codes = rng.integers(0, 16, size=(2, k))
    zeros = np.full((2, k // 128), 8) if symmetric else rng.integers(0, 16, size=(2, k // 128))
    scales = rng.uniform(0.5, 2.0, size=(2, k // 128)).astype(np.float32)
    x = torch.randn(k).to(torch.bfloat16)
    xbits = x.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    words = sum(codes[:, i::8].astype(np.int64) << (4 * i) for i in range(8))  # [2, k / 8]
    units = [sum(int(xbits[4 * u + i]) << (16 * i) for i in range(4)) for u in range(k // 4)]

    def neg_bias(z: int) -> int:
        b = (np.float32(-(128 + z)).view(np.uint32).item() >> 16)
        return b | b << 16

    operands = []
    for lane in range(32):
        grp = lane * 32 // 128
        operands.append([None] * 4 + [int(w) for w in words[0, 4 * lane:4 * lane + 4]]
                        + [int(w) for w in words[1, 4 * lane:4 * lane + 4]] + units[8 * lane:8 * lane + 8]
                        + [scales[0, grp], scales[1, grp], neg_bias(zeros[0, grp]), neg_bias(zeros[1, grp])]
                        + [np.float32(0)] * 4)  # fmt: skip
    warp = _Warp(operands)
    warp.run(STEP_ASM.value)
    frags = [[warp.regs[lane][f"${r}"] for r in range(4)] for lane in range(32)]
    diag = _Warp([[None, None, *f] for f in frags])
    diag.run(DIAGONAL_ASM.value)
    got = [sum(float(diag.regs[lane][f"${r}"]) for lane in range(32)) for r in (0, 1)]
    deq = (codes - np.repeat(zeros, 128, axis=1)) * np.repeat(scales, 128, axis=1)
    want = deq @ x.float().numpy().astype(np.float64)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-3), (got, want)

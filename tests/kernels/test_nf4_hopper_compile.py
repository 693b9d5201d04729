"""The bitsandbytes 4-bit lookup-table GEMM (`triton_nf4_linear.py`) compiled for Hopper (sm_90) on the CPU, by
Triton's compiler and ptxas, with `test_hopper_compile.py`'s helper: this file run as a script in a child process,
the interpreter off (kernels must be defined without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def _compile() -> dict[str, dict[str, object]]:
    """Its default tiles at bf16: decode (16 x 64 swap AB, split-K partials), 64 rows and prefill (128 x 128)."""
    import triton.language as tl
    from test_hopper_compile import _compile_for_hopper

    from flotilla.kernels.triton_nf4_linear import _nf4_kernel

    fn = _nf4_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("K", "stride_xm", "stride_wn",
                                                                             "stride_om", "k_per_split"))
    pointers = {"x_ptr": "*bf16", "w_ptr": "*u8", "a_ptr": "*fp32", "t_ptr": "*fp32", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "part_ptr": "*fp32"}
    common = dict(HAS_BIAS=False, BLOCK_K=64, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32")
    decode = dict(common, SPLIT_K=5, BLOCK_M=16, BLOCK_N=64, NUM_STAGES=4, SWAP_AB=True)
    rows64 = dict(common, SPLIT_K=1, BLOCK_M=64, BLOCK_N=64, NUM_STAGES=4, SWAP_AB=False)
    prefill = dict(common, SPLIT_K=1, BLOCK_M=128, BLOCK_N=128, NUM_STAGES=3, SWAP_AB=False)
    return {"nf4 decode": _compile_for_hopper(fn, pointers, decode, aligned, num_warps=4, num_stages=4),
            "nf4 m64": _compile_for_hopper(fn, pointers, rows64, aligned, num_warps=4, num_stages=4),
            "nf4 prefill": _compile_for_hopper(fn, pointers, prefill, aligned, num_warps=8, num_stages=3)}


def test_nf4_linear_compiles_for_hopper(tmp_path):
    """Every default tile compiles to a cubin whose product runs on the tensor cores."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, __file__], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    if "CUDA backend" in run.stderr and run.returncode:
        pytest.skip("Triton's CUDA backend is not installed")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["cubin_bytes"] > 0 and r["mma"], name


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(_compile()))

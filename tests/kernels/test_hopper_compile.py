"""The fp8 KV-cache kernels compiled for Hopper (sm_90) on the CPU, by Triton's compiler and ptxas.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python, so it accepts code the compiler refuses:
a plain-float global read inside a `@triton.jit` function passed every interpreter test and failed to
compile on the H200. `triton.compile` with a `GPUTarget` needs no GPU (it lowers to PTX and assembles a
cubin with the ptxas Triton ships), but it needs the kernels defined with the interpreter off, so the
compilation runs in a child process: this file run as a script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def _signature(fn, pointers: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    """Pointer args by name, constexprs as given, `inv_*` scales fp32, every other argument i32."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers[name]
        else:
            sig[name] = "fp32" if name.startswith("inv_") else "i32"
    return sig


def _compile_for_hopper(fn, pointers: dict[str, str], constexprs: dict[str, object]) -> dict[str, object]:
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(fn, _signature(fn, pointers, constexprs), constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    ptx = kernel.asm["ptx"]
    return {"cubin_bytes": len(kernel.asm["cubin"]), "e4m3_cvt": "e4m3" in ptx}


def _compile_all() -> dict[str, dict[str, object]]:
    from flotilla.kernels.triton_kv_write import _kv_write_kernel
    from flotilla.kernels.triton_rotary_kv_write import _rotary_kv_write_kernel

    out = {}
    out["kv_write *fp8e4nv"] = _compile_for_hopper(
        _kv_write_kernel,
        {"key_ptr": "*bf16", "value_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv",
         "slot_mapping_ptr": "*i64"},
        dict(NUM_KV_HEADS=8, HEADS_PAD=8, HEAD_DIM=128, BLOCK_D=128, PAGE=16, FP8=True),
    )
    pointers = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr")}
    pointers |= {"positions_ptr": "*i64", "slot_mapping_ptr": "*i64", "cos_sin_ptr": "*fp32",
                 "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"}  # fmt: skip
    constexprs = dict(Q_HEADS_PAD=32, K_HEADS_PAD=8, HALF=64, HALF_PAD=64, PAGE=16, FP8=True)
    out["rotary_kv_write *fp8e4nv"] = _compile_for_hopper(_rotary_kv_write_kernel, pointers, constexprs)
    return out


def _cuda_backend_missing() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return True
    return False


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_fp8_kv_write_kernels_compile_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, __file__], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(r["cubin_bytes"] > 0 for r in result.values())
    # the fp32 -> e4m3 stores are the hardware conversion (cvt.rn.satfinite.e4m3x2), not a software one
    assert all(r["e4m3_cvt"] for r in result.values())


if __name__ == "__main__":
    print(json.dumps(_compile_all()))

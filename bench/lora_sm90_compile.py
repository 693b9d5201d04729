"""Compile the LoRA Triton kernels for Hopper (sm_90) on a machine without a GPU.

    TRITON_DEFAULT_FP_FUSION=1 .venv/bin/python bench/lora_sm90_compile.py

Triton ships ptxas, so `triton.compile` with an explicit `GPUTarget("cuda", 90, 32)` lowers a kernel
to PTX and a cubin without a device: a check that the kernels compile for the H200 (no run, no
timing). Prints each variant's shared memory, and its registers per thread and spilled bytes as the
bundled `ptxas -v` reports them for the PTX (no driver needed).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from flotilla.kernels import triton_gemv, triton_lora, triton_lora_segments, triton_lora_stacked

TARGET = GPUTarget("cuda", 90, 32)
SHRINK = {"x_ptr": "*bf16", "a_ptr": "*bf16", "slots_ptr": "*i64", "part_ptr": "*fp32", "stride_x": "i32",
          "stride_as": "i32", "stride_ar": "i32", "stride_ps": "i32", "stride_pt": "i32", "K": "i32", "R": "i32",
          "K_PER_SPLIT": "i32", "BLOCK_R": "constexpr", "BLOCK_K": "constexpr"}
EXPAND = {"y_ptr": "*bf16", "part_ptr": "*fp32", "b_ptr": "*bf16", "slots_ptr": "*i64", "stride_y": "i32",
          "stride_ps": "i32", "stride_pt": "i32", "stride_bs": "i32", "stride_bn": "i32", "N": "i32", "R": "i32",
          "SPLITS": "i32", "OFF1": "i32", "OFF2": "i32", "N_SLICES": "constexpr", "BLOCK_N": "constexpr",
          "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"}
SEGMENTS = {"slots_ptr": "*i64", "order_ptr": "*i32", "starts_ptr": "*i32", "T": "i32", "S": "i32",
            "BLOCK_T": "constexpr", "BLOCK_S": "constexpr"}
SEG_SHRINK = {"x_ptr": "*bf16", "a_ptr": "*bf16", "order_ptr": "*i32", "starts_ptr": "*i32", "part_ptr": "*fp32",
              "stride_x": "i32", "stride_as": "i32", "stride_ar": "i32", "stride_ps": "i32", "stride_pt": "i32",
              "K": "i32", "R": "i32", "S": "i32", "K_PER_SPLIT": "i32", "DOT_DTYPE": "constexpr",
              "DOT_PRECISION": "constexpr", "BLOCK_M": "constexpr", "BLOCK_R": "constexpr", "BLOCK_K": "constexpr",
              "BLOCK_S": "constexpr"}
SEG_EXPAND = {"y_ptr": "*bf16", "part_ptr": "*fp32", "b_ptr": "*bf16", "order_ptr": "*i32", "starts_ptr": "*i32",
              "stride_y": "i32", "stride_ps": "i32", "stride_pt": "i32", "stride_bs": "i32", "stride_bn": "i32",
              "R": "i32", "S": "i32", "SIZE0": "i32", "SIZE1": "i32", "SIZE2": "i32", "SPLITS": "constexpr",
              "DOT_DTYPE": "constexpr", "DOT_PRECISION": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
              "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"}
STACKED_EXPAND = {"out_ptr": "*bf16", "ext_ptr": "*bf16", "b_ptr": "*bf16", "order_ptr": "*i32", "starts_ptr": "*i32",
                  "T": "i32", "stride_o": "i32", "stride_e": "i32", "stride_bs": "i32", "stride_bn": "i32", "N": "i32",
                  "R": "i32", "ROWS": "i32", "S": "i32", "SIZE0": "i32", "SIZE1": "i32", "SIZE2": "i32",
                  "DOT_DTYPE": "constexpr", "DOT_PRECISION": "constexpr", "BLOCK_M": "constexpr",
                  "BLOCK_N": "constexpr", "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"}
GEMV = {"x_ptr": "*bf16", "w_ptr": "*bf16", "scale_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16",
        "part_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
        "stride_om": "i32", "k_per_split": "i32", "lora_part_ptr": "*fp32", "lora_b_ptr": "*bf16",
        "lora_slots_ptr": "*i64", "stride_lps": "i32", "stride_lpt": "i32", "stride_lbs": "i32", "stride_lbn": "i32",
        "lora_r": "i32", "lora_splits": "i32", "lora_off1": "i32", "lora_off2": "i32", "HAS_SCALE": "constexpr",
        "HAS_BIAS": "constexpr", "SPLIT_K": "constexpr", "USE_DOT": "constexpr", "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "NUM_STAGES": "constexpr", "DOT_DTYPE": "constexpr",
        "DOT_PRECISION": "constexpr", "LORA_SLICES": "constexpr", "LORA_BLOCK_R": "constexpr",
        "LORA_BLOCK_S": "constexpr"}
DOT = {"DOT_DTYPE": tl.bfloat16, "DOT_PRECISION": "tf32"}


def ptxas_usage(ptx: str) -> str:
    """Registers per thread and spilled bytes of a kernel's PTX, from the bundled `ptxas -v`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        run = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return f"{regs.group(1) if regs else '?'} registers, spills {spills.group(1) if spills else '?'}/" \
           f"{spills.group(2) if spills else '?'} bytes (stores/loads)"


def compile_for_hopper(fn, signature: dict[str, str], constexprs: dict, name: str, num_warps: int = 4) -> None:
    """Compile one variant for sm_90 and print what it came to."""
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=TARGET,
                            options={"num_warps": num_warps})
    print(f"{name}: shared {kernel.metadata.shared} bytes, {ptxas_usage(kernel.asm['ptx'])}")


def main() -> None:
    compile_for_hopper(triton_lora._shrink_kernel, SHRINK, {"BLOCK_R": 16, "BLOCK_K": 256}, "shrink")
    for slices in (1, 2, 3):
        for block_n, block_s in ((64, 16), (128, 2), (64, 64)):
            consts = {"N_SLICES": slices, "BLOCK_N": block_n, "BLOCK_R": 16, "BLOCK_S": block_s}
            compile_for_hopper(triton_lora._expand_kernel, EXPAND, consts,
                               f"expand slices={slices} BLOCK_N={block_n} BLOCK_S={block_s}")
    for block_t in (16, 256):
        compile_for_hopper(triton_lora_segments._segments_kernel, SEGMENTS, {"BLOCK_T": block_t, "BLOCK_S": 16},
                           f"segments BLOCK_T={block_t}")
    for block_m, block_k in ((16, 256), (64, 256), (64, 128)):
        compile_for_hopper(triton_lora_segments._shrink_kernel, SEG_SHRINK,
                           {**DOT, "BLOCK_M": block_m, "BLOCK_R": 16, "BLOCK_K": block_k, "BLOCK_S": 8},
                           f"segment shrink BLOCK_M={block_m} BLOCK_K={block_k}")
    for block_m, block_n, splits in ((16, 128, 8), (16, 128, 16), (64, 64, 1)):
        compile_for_hopper(triton_lora_segments._expand_kernel, SEG_EXPAND,
                           {**DOT, "SPLITS": splits, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_R": 16,
                            "BLOCK_S": 8}, f"segment expand BLOCK_M={block_m} BLOCK_N={block_n} SPLITS={splits}")
    for block_m, block_n in ((16, 128), (16, 256), (64, 128)):
        compile_for_hopper(triton_lora_stacked._stacked_expand_kernel, STACKED_EXPAND,
                           {**DOT, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_R": 16, "BLOCK_S": 16},
                           f"stacked expand BLOCK_M={block_m} BLOCK_N={block_n}")
    # The GEMV at one row as Llama-3.1-8B's qkv (16 x 512 tiles) and o/down (8 x 512) take it, with and
    # without the LoRA epilogue (16 shrink splits at qkv/o, 56 at down: BLOCK_S 16 and 64).
    for block_n, slices, block_s in ((16, 0, 2), (16, 3, 16), (8, 0, 2), (8, 1, 16), (8, 1, 64)):
        compile_for_hopper(triton_gemv._gemv_kernel, GEMV,
                           {**DOT, "HAS_SCALE": False, "HAS_BIAS": False, "SPLIT_K": 1, "USE_DOT": False,
                            "BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": 512, "NUM_STAGES": 2,
                            "LORA_SLICES": slices, "LORA_BLOCK_R": 16, "LORA_BLOCK_S": block_s},
                           f"gemv M=1 BLOCK_N={block_n} lora slices={slices} BLOCK_S={block_s}")


if __name__ == "__main__":
    main()

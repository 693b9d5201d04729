"""Compile the LoRA Triton kernels for Hopper (sm_90) on a machine without a GPU.

    TRITON_DEFAULT_FP_FUSION=1 .venv/bin/python bench/lora_sm90_compile.py

Triton ships ptxas, so `triton.compile` with an explicit `GPUTarget("cuda", 90, 32)` lowers a kernel
to PTX and a cubin without a device: a check that the kernels compile for the H200 (no run, no
timing). Prints each variant's PTX size and shared memory.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flotilla.kernels import triton_lora

TARGET = GPUTarget("cuda", 90, 32)
SHRINK = {"x_ptr": "*bf16", "a_ptr": "*bf16", "slots_ptr": "*i64", "part_ptr": "*fp32", "stride_x": "i32",
          "stride_as": "i32", "stride_ar": "i32", "stride_ps": "i32", "stride_pt": "i32", "K": "i32", "R": "i32",
          "K_PER_SPLIT": "i32", "BLOCK_R": "constexpr", "BLOCK_K": "constexpr"}
EXPAND = {"y_ptr": "*bf16", "part_ptr": "*fp32", "b_ptr": "*bf16", "slots_ptr": "*i64", "stride_y": "i32",
          "stride_ps": "i32", "stride_pt": "i32", "stride_bs": "i32", "stride_bn": "i32", "N": "i32", "R": "i32",
          "SPLITS": "i32", "OFF1": "i32", "OFF2": "i32", "N_SLICES": "constexpr", "BLOCK_N": "constexpr",
          "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"}


def compile_for_hopper(fn, signature: dict[str, str], constexprs: dict[str, int], name: str) -> None:
    """Compile one variant for sm_90 and print what it came to."""
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=TARGET)
    print(f"{name}: ptx {len(kernel.asm['ptx'].splitlines())} lines, cubin {len(kernel.asm['cubin'])} bytes, "
          f"shared {kernel.metadata.shared} bytes")


def main() -> None:
    compile_for_hopper(triton_lora._shrink_kernel, SHRINK, {"BLOCK_R": 16, "BLOCK_K": 256}, "shrink")
    for slices in (1, 2, 3):
        for block_n, block_s in ((64, 16), (128, 2), (64, 64)):
            consts = {"N_SLICES": slices, "BLOCK_N": block_n, "BLOCK_R": 16, "BLOCK_S": block_s}
            compile_for_hopper(triton_lora._expand_kernel, EXPAND, consts,
                               f"expand slices={slices} BLOCK_N={block_n} BLOCK_S={block_s}")


if __name__ == "__main__":
    main()

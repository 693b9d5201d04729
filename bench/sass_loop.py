"""Compile one Triton kernel for sm_90 on the CPU and print its main loop's SASS instruction mix.

    python3 bench/sass_loop.py flotilla.kernels.triton_int4_gemv_wide:_int4_gemv_wide_kernel \\
        --ptr x_ptr=*i64 --ptr packed_ptr=*i32 --const BLOCK_N=32 --const NUM_STAGES=1 --stages 1 ...

Pointer arguments default to `*bf16` (`--ptr name=type` for others), arguments named in `--aligned` (default: every
pointer, every `stride_*` and `KW`, `N`, `words_per_split`) are compiled as multiples of 16 (the JIT's
specialisation of aligned tensors and round shapes), other arguments i32. The loop is the longest backward branch
in the SASS (nvdisasm, shipped with Triton). Prints registers, spills (stack), shared memory, the loop's length and
its opcodes by count, the whole kernel's instructions (`total`: for kernels without a loop) and its 16-byte global
loads and stores (SASS `LDG*.128`, cp.async included, and `STG.128`), and the PTX's 16-byte loads and barriers.
`--int NAME=value` specialises an integer argument as the JIT does for that value (1: a constant, a multiple of 16:
aligned); constexprs left out take their defaults; `--const X=tl.bfloat16` passes a dtype; `--dump F` keeps the SASS
(and F.ttgir: the layouts). A name the kernel does not take, or a constexpr with no default left out, is an error: a
renamed argument would otherwise compile another variant without a word.
bench/results/audit10-sass.sh runs it over the decode path's kernels at the engine's launches under both Tritons.

Why: the H200 runs Triton 3.6 while the CPU machines install 3.9, and the two lay out the same kernel differently
(session 10: the wide int4 GEMV's first version had its warps' threads across rows under 3.6 only, 1,402 instead
of 774 instructions a step). Run it under the GPU's version too: `pip download triton==3.6.0 --no-deps`, unzip the
wheel into a folder, `chmod +x` its `triton/backends/nvidia/bin/*`, and put the folder first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path


def _value(text: str) -> object:
    """A constexpr from the command line: int, bool, a Triton dtype (`tl.bfloat16`), or the text."""
    if text.startswith("tl."):
        import triton.language as tl

        return getattr(tl, text[3:])
    if text.lstrip("-").isdigit():
        return int(text)
    return {"True": True, "False": False}.get(text, text)


def loop_ops(sass: str) -> tuple[int, dict[str, int]]:
    """The longest loop (a branch back to an earlier label) of `sass`: its length and opcode counts."""
    labels: dict[str, int] = {}
    seq: list[str] = []
    for line in sass.splitlines():
        label = re.match(r"\s*\.L_x_(\d+):", line)
        if label:
            labels[label.group(1)] = len(seq)
            continue
        ins = re.search(r"/\*[0-9a-f]{4,6}\*/\s+(.*?);", line)
        if ins:
            seq.append(ins.group(1).strip())
    best = (0, 0)
    for i, ins in enumerate(seq):
        target = re.search(r"BRA.*\.L_x_(\d+)", ins)
        if target and labels.get(target.group(1), i + 1) <= i and i + 1 - labels[target.group(1)] > best[1] - best[0]:
            best = (labels[target.group(1)], i + 1)
    body = seq[best[0] : best[1]]
    ops = collections.Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", ins).split()[0].split(".")[0] for ins in body)
    return len(body), dict(ops.most_common())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", help="module:function of a @triton.jit kernel")
    p.add_argument("--ptr", action="append", default=[], help="name=type of a pointer argument (default *bf16)")
    p.add_argument("--const", action="append", default=[], help="NAME=value of a constexpr")
    p.add_argument("--aligned", default="", help="comma list of arguments compiled as multiples of 16")
    # an integer argument specialised as the JIT does for that value: 1 a constant, a multiple of 16 aligned
    p.add_argument("--int", action="append", default=[], help="NAME=value of an integer argument")
    p.add_argument("--dump", help="also write the whole SASS to this file")
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=3)
    a = p.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget

    module, _, name = a.kernel.partition(":")
    fn = getattr(importlib.import_module(module), name)
    named = [item.split("=", 1)[0] for item in a.ptr + a.const + a.int] + (a.aligned.split(",") if a.aligned else [])
    unknown = [n for n in named if n not in fn.arg_names]
    if unknown:  # a renamed or removed argument would otherwise compile another variant without a word
        raise SystemExit(f"not arguments of {name}: {', '.join(unknown)}")
    # constexprs left out take their defaults from the signature (the launcher's behaviour)
    consts = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    consts |= {k: _value(v) for k, v in (c.split("=", 1) for c in a.const)}
    unset = [p.name for p in fn.params if p.is_constexpr and p.name not in consts]
    if unset:  # Triton would compile them as i32 arguments
        raise SystemExit(f"constexprs of {name} without a value: {', '.join(unset)}")
    ints = {k: int(v) for k, v in (c.split("=", 1) for c in a.int)}
    consts |= {k: 1 for k, v in ints.items() if v == 1}
    ptrs = dict(item.split("=", 1) for item in a.ptr)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "*bf16") if n.endswith("_ptr") or n in ptrs else "i32"
           for n in fn.arg_names}  # fmt: skip
    round_ints = ("KW", "N", "words_per_split")
    aligned = set(a.aligned.split(",")) if a.aligned else {
        n for n in fn.arg_names if sig[n].startswith("*") or n.startswith("stride_") or n in round_ints}
    aligned = (aligned - ints.keys()) | {n for n, v in ints.items() if v != 1 and v % 16 == 0}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
    src = triton.compiler.ASTSource(fn, sig, {k: v for k, v in consts.items() if k in fn.arg_names}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": a.warps,
                                                                          "num_stages": a.stages})  # fmt: skip
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([bin_dir / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([bin_dir / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
    if a.dump:
        Path(a.dump).write_text(sass)
        Path(a.dump + ".ttgir").write_text(kernel.asm["ttgir"])
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    length, ops = loop_ops(sass)
    every = re.findall(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)", sass)
    ptx = kernel.asm["ptx"]
    print(json.dumps({
        "triton": triton.__version__, "regs": int(regs.group(1)) if regs else None,
        "stack": int(stack.group(1)) if stack else None, "shared": kernel.metadata.shared, "loop_len": length,
        "loop_ops": ops, "total": len(every), "ldg": sum(o.startswith("LDG") for o in every),
        "ldg_128": sum(o.startswith("LDG") and ".128" in o for o in every),  # LDG and LDGSTS (cp.async), 16 bytes
        "stg_128": sum(o.startswith("STG") and ".128" in o for o in every),
        "ptx_bar_sync": ptx.count("bar.sync"),
        "ptx_16_byte_loads": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*0x10[,;]|ld\.global[.a-z]*\.v4\.b32",
                                            ptx)),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

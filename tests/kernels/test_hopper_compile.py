"""The fp8 and int4 kernels (KV-cache writes, the W8A16 and W4A16 GEMVs, the activation quantization, the
int4 GEMM and dequantization) and the LoRA kernels of the default (stacked) kernel set compiled for Hopper
(sm_90) on the CPU, by Triton's compiler and ptxas.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python, so it accepts code the compiler refuses:
a plain-float global read inside a `@triton.jit` function passed every interpreter test and failed to
compile on the H200. `triton.compile` with a `GPUTarget` needs no GPU (it lowers to PTX and assembles a
cubin with the ptxas Triton ships), but it needs the kernels defined with the interpreter off, so the
compilation runs in a child process: this file run as a script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


# The fused qkv kernels' one tuple argument `rope`: `rope_kv_store`'s operands, in `rope_launch_args`' order (a
# tuple's members are typed and aligned here by these names, as the other arguments by theirs)
_TUPLE_MEMBERS = {"rope": ("positions_ptr", "cos_sin_ptr", "slot_mapping_ptr", "q_out_ptr", "k_cache_ptr",
                           "v_cache_ptr", "stride_cs", "stride_kcb", "stride_kcs", "stride_kch", "stride_vcb",
                           "stride_vcs", "stride_vch", "num_q_heads", "num_kv_heads", "inv_k_scale",
                           "inv_v_scale")}  # fmt: skip


def _arg_names(fn) -> list[str]:
    """`fn`'s argument names, a tuple argument's members (`_TUPLE_MEMBERS`) in its place."""
    return [member for name in fn.arg_names for member in _TUPLE_MEMBERS.get(name, (name,))]


def _arg_type(name: str, pointers: dict[str, str]) -> str:
    """Pointer args by name, `inv_*`, `qk_scale`, `out_scale` and `eps` fp32, every other argument i32."""
    if name.endswith("_ptr") or name in pointers:  # pointers, and tensor descriptors ("tensordesc<...>")
        return pointers[name]
    return "fp32" if name.startswith("inv_") or name in ("qk_scale", "out_scale", "eps") else "i32"


def _signature(fn, pointers: dict[str, str], constexprs: dict[str, object]) -> dict[str, object]:
    """Constexprs as given, a tuple argument as its members' types, every other argument `_arg_type`."""
    sig: dict[str, object] = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _TUPLE_MEMBERS:
            sig[name] = tuple(_arg_type(member, pointers) for member in _TUPLE_MEMBERS[name])
        else:
            sig[name] = _arg_type(name, pointers)
    return sig


def _aligned_paths(fn, aligned: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The argument paths (`(i,)`, or `(i, j)` for a tuple argument's member j) of the names in `aligned`."""
    paths = []
    for i, name in enumerate(fn.arg_names):
        members = _TUPLE_MEMBERS.get(name)
        if members is None:
            paths += [(i,)] if name in aligned else []
        else:
            paths += [(i, j) for j, member in enumerate(members) if member in aligned]
    return paths


# 16-byte global loads: cp.async of 16 bytes (a pipelined load) or ld.global.v4 of 32-bit elements
_LOAD16 = r"cp\.async\.c[ag]\.shared\.global[^;]*0x10[,;]|ld\.global[.a-z]*\.v4\.b32"


def _compile_for_hopper(
    fn, pointers: dict[str, str], constexprs: dict[str, object], aligned: tuple[str, ...] = (), **options: int
) -> dict[str, object]:
    """`aligned`: arguments the JIT would see as multiples of 16 (pointers, strides), so that the
    compile takes the same vectorised path the GPU's does."""
    from triton.backends.compiler import GPUTarget

    # constexprs left out take their defaults (else they would be typed as i32 arguments)
    constexprs = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | constexprs
    attrs = {path: [["tt.divisibility", 16]] for path in _aligned_paths(fn, aligned)}
    src = triton.compiler.ASTSource(fn, _signature(fn, pointers, constexprs), constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options or None)
    ptx = kernel.asm["ptx"]
    wait_at = ptx.find("griddepcontrol.wait")
    return {"loads_before_wait": ptx[:wait_at].count("ld.global") if wait_at >= 0 else 0,
            "loads16_before_wait": ptx[:wait_at].count("ld.global.v4") if wait_at >= 0 else 0,
            "launch_before_wait": ptx[:wait_at].count("griddepcontrol.launch_dependents") if wait_at >= 0 else 0,
            "stores_before_wait": ptx[:wait_at].count("st.global") if wait_at >= 0 else 0,
            "l2_prefetch": ptx.count("cp.async.bulk.prefetch.L2"),
            "cubin_bytes": len(kernel.asm["cubin"]), "e4m3_cvt": "e4m3" in ptx, "mma": "mma" in ptx,
            "i2f": "cvt.rn.f32.s32" in ptx or "cvt.rn.f32.u32" in ptx, "bar_sync": ptx.count("bar.sync"),
            "byte_smem_reads": ptx.count("ld.shared.b8") + ptx.count("ld.shared.u8"), "selp": ptx.count("selp"),
            "ldmatrix": ptx.count("ldmatrix"), "gdc_wait": ptx.count("griddepcontrol.wait"),
            "gdc_launch": ptx.count("griddepcontrol.launch_dependents"),
            "wgmma": "wgmma.mma_async" in ptx, "atomics": "atom." in ptx, "prefetch": ptx.count("prefetch.global.L2"),
            "tma": "cp.async.bulk.tensor" in ptx, "lop3": ptx.count("lop3.b32"),
            "loads16": len(re.findall(_LOAD16, ptx)), "loads": ptx.count("ld.global"),
            # 2-byte loads (the decode kernel's query, `stride_qh` not aligned here) before the first branch (its
            # inactive split's return)
            "loads2_before_branch": ptx[: re.search(r"\bbra\b", ptx).start() if re.search(r"\bbra\b", ptx)
                                        else len(ptx)].count("ld.global.b16")}  # fmt: skip


# The script modes each test reads (`MODES`, at the end of the file).
_TEST_MODES = {"test_gated_gemv_compiles_for_hopper": ("gated",),
               "test_fp8_row_gemv_compiles_for_hopper": ("fp8row",),
               "test_fp8_kernels_compile_for_hopper": ("all-a", "all-b"),
               "test_prefill_loop_forms_compile_for_hopper": ("prefill",),
               "test_fused_moe_compiles_for_hopper": ("moe",),
               "test_int8_kernels_compile_for_hopper": ("int8",),
               "test_fp8_block_linear_compiles_for_hopper": ("fp8block",)}  # fmt: skip


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable]:
    """`compiled(mode)`: the JSON this file prints run as a script in `mode`, with the interpreter off. The modes of
    every selected test of this file start at once, each a child process with a Triton cache of its own: Triton's
    passes and ptxas run on one core, so on the 2-core CI machine they share the cores instead of queueing."""
    root = tmp_path_factory.mktemp("hopper")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    jobs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(mode: str) -> None:
        folder = root / mode
        folder.mkdir()
        with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
            jobs[mode] = (subprocess.Popen([sys.executable, __file__, mode], cwd=folder, stdout=out, stderr=err,
                                           env={**env, "TRITON_CACHE_DIR": str(folder / "cache")}), folder)  # fmt: skip

    for mode in dict.fromkeys(m for item in request.session.items if getattr(item, "module", None) is request.module
                              for m in _TEST_MODES.get(getattr(item, "originalname", ""), ())):  # fmt: skip
        start(mode)

    def result(mode: str) -> dict[str, dict[str, object]]:
        if mode not in jobs:
            start(mode)
        process, folder = jobs[mode]
        process.wait(600)  # the modes share the cores: each takes longer than alone
        assert process.returncode == 0, (folder / "stderr").read_text()[-4000:]
        return json.loads((folder / "stdout").read_text().strip().splitlines()[-1])

    yield result
    for process, _ in jobs.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def _compile_kv_writes() -> dict[str, dict[str, object]]:
    """The fp8 KV-cache writes: the plain one and the one with the rotary embedding."""
    from flotilla.kernels.triton_kv_write import _kv_write_kernel
    from flotilla.kernels.triton_rotary_kv_write import _rotary_kv_write_kernel

    out = {}
    out["kv_write *fp8e4nv"] = _compile_for_hopper(
        _kv_write_kernel,
        {
            "key_ptr": "*bf16",
            "value_ptr": "*bf16",
            "k_cache_ptr": "*fp8e4nv",
            "v_cache_ptr": "*fp8e4nv",
            "slot_mapping_ptr": "*i64",
        },
        dict(NUM_KV_HEADS=8, HEADS_PAD=8, HEAD_DIM=128, BLOCK_D=128, PAGE=16, FP8=True),
    )
    pointers = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr")}
    pointers |= {"positions_ptr": "*i64", "slot_mapping_ptr": "*i64", "cos_sin_ptr": "*fp32",
                 "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"}  # fmt: skip
    constexprs = dict(Q_HEADS_PAD=32, K_HEADS_PAD=8, HALF=64, HALF_PAD=64, PAGE=16, FP8=True)
    out["rotary_kv_write *fp8e4nv"] = _compile_for_hopper(_rotary_kv_write_kernel, pointers, constexprs)
    return out


def _compile_all() -> dict[str, dict[str, object]]:
    """Every kernel `test_fp8_kernels_compile_for_hopper` checks (the script with no mode)."""
    return {name: r for part in _ALL_PARTS.values() for name, r in part().items()}


def _compile_pdl() -> dict[str, dict[str, object]]:
    """The batch-1 decode chain's kernels as launched by programmatic dependent launch (kernels/pdl.py): the bf16
    and fp8 GEMVs at one row (first weight tile loaded before the wait; with and without the L2 prefetch), the
    plain bf16 GEMV, RMSNorm, SiLU-and-mul and the fused rotary + KV write at Llama-3.1-8B's shapes."""
    import triton.language as tl

    from flotilla.kernels.triton_activation import _silu_and_mul_kernel
    from flotilla.kernels.triton_gemv import _gemv_kernel
    from flotilla.kernels.triton_rmsnorm import _rms_norm_kernel
    from flotilla.kernels.triton_rotary_kv_write import _rotary_kv_write_kernel

    fn = _gemv_kernel
    aligned = tuple(n for n in fn.arg_names
                    if n.endswith("_ptr") or n in ("K", "k_per_split", "stride_xm", "stride_wn"))  # fmt: skip
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "scale_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16",
                "part_ptr": "*fp32", "lora_part_ptr": "*fp32", "lora_b_ptr": "*bf16", "lora_slots_ptr": "*i32"}
    common = dict(HAS_SCALE=False, HAS_BIAS=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", LORA_SLICES=0,
                  LORA_BLOCK_R=16, LORA_BLOCK_S=2, SPLIT_K=1, USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=512,
                  NUM_STAGES=2)  # fmt: skip
    out = {}
    for name, extra in (("gemv bf16 m1", {}), ("gemv bf16 m1 pdl", dict(PDL=True)),
                        ("gemv bf16 m1 pdl l2", dict(PDL=True, PREFETCH_K=4096, PREFETCH_SEGS=8))):  # fmt: skip
        out[name] = _compile_for_hopper(fn, pointers, dict(common, **extra), aligned, num_warps=4, num_stages=2)
    fp8 = dict(common, HAS_SCALE=True, BLOCK_N=8, NUM_STAGES=3, PDL=True)
    fp8_pointers = dict(pointers, w_ptr="*fp8e4nv")
    out["fp8_gemv fma m1 pdl"] = _compile_for_hopper(fn, fp8_pointers, fp8, aligned, num_warps=4, num_stages=3)
    norm = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": "*bf16",
            "residual_out_ptr": "*bf16"}  # fmt: skip
    norm_consts = dict(HAS_RESIDUAL=True, BLOCK=4096, PDL=True)
    out["rms_norm bf16 pdl"] = _compile_for_hopper(_rms_norm_kernel, norm, norm_consts, num_warps=8)
    out["silu_and_mul bf16 pdl"] = _compile_for_hopper(_silu_and_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"},
                                                  dict(BLOCK=1024, PDL=True), num_warps=4)  # fmt: skip
    rot = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "k_cache_ptr", "v_cache_ptr")}
    rot |= {"positions_ptr": "*i64", "slot_mapping_ptr": "*i64", "cos_sin_ptr": "*fp32"}
    consts = dict(Q_HEADS_PAD=32, K_HEADS_PAD=8, HALF=64, HALF_PAD=64, PAGE=16, FP8=False, PDL=True)
    out["rotary_kv_write bf16 pdl"] = _compile_for_hopper(_rotary_kv_write_kernel, rot, consts, num_warps=8)
    from flotilla.kernels.triton_l2_prefetch import _l2_prefetch_kernel

    out["l2_prefetch bf16"] = _compile_for_hopper(_l2_prefetch_kernel, {"w_ptr": "*u8"}, dict(CHUNK=1488, BLOCK=128),
                                                  num_warps=4)  # fmt: skip
    return out


def _compile_skinny_gemm() -> dict[str, dict[str, object]]:
    """The skinny decode GEMM as the dispatch launches it at batch 64 (bf16, M divisible by 16, 64-row batch
    tile): whole tiles with and without the split-K fix-up, and the gated SiLU epilogue."""
    import triton.language as tl

    from flotilla.kernels.triton_skinny_gemm import _skinny_gemm_kernel, _skinny_gemm_tma_kernel

    fn = _skinny_gemm_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("M", "N", "K", "k_per_split")
                    or n.startswith("stride_"))  # fmt: skip
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32",
                "counter_ptr": "*i32"}  # fmt: skip
    common = dict(BLOCK_N=128, BLOCK_M=64, BLOCK_K=64, HAS_BIAS=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32")
    out = {}
    for name, split, gated in (("skinny_gemm bf16", False, False), ("skinny_gemm bf16 split", True, False),
                               ("skinny_gemm bf16 gated split", True, True)):  # fmt: skip
        constexprs = dict(common, SPLIT=split, GATED=gated, EVEN=True)
        out[name] = _compile_for_hopper(fn, pointers, constexprs, aligned, num_warps=4, num_stages=4)
    tma = _skinny_gemm_tma_kernel
    aligned = tuple(n for n in tma.arg_names if n.endswith("_ptr") or n in ("M", "N", "K", "k_per_split", "stride_om"))
    descs = {"x_desc": "tensordesc<bf16[64, 64]>", "w_desc": "tensordesc<bf16[128, 64]>"}
    constexprs = dict(common, SPLIT=True, GATED=False)
    out["skinny_gemm bf16 tma split"] = _compile_for_hopper(tma, pointers | descs, constexprs, aligned, num_warps=4,
                                                            num_stages=4)  # fmt: skip
    return out


def _compile_paged_decode() -> dict[str, dict[str, object]]:
    """The decode attention at Llama-3.1-8B's shape with 32 splits (fused merge), on a bf16 pool and on
    an fp8 pool (KV_FP8 2 and 4: bytes, PTX bit moves; 1: bytes, Triton ops; 3: the hardware e4m3 -> fp16
    cvt, 5: the same in PTX; 0: Triton's upcast; "_k": K converted in its load layout too)."""
    import triton.language as tl

    from flotilla.kernels.triton_paged_decode import _decode_split_kernel

    fn = _decode_split_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or (n.startswith("stride_") and n != "stride_qh"))
    common = dict(NUM_HEADS=32, NUM_SPLITS=32, SPLITS_PAD=32, GROUP=4, GROUP_PAD=16, GROUP_P2=4, MERGE_CHUNK=32,
                  HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=64, DOT_PRECISION="tf32", FUSED_MERGE=True,
                  EARLY_START=False, PREFETCH_TOKENS=0, LINE_ELEMS=64)  # fmt: skip
    out = {}
    pools = [("bf16", "*bf16", tl.bfloat16, 0, False), ("fp8 asm", "*u8", tl.float16, 2, False),
             ("fp8 bits", "*u8", tl.float16, 1, False), ("fp8 cvt", "*fp8e4nv", tl.bfloat16, 0, False),
             ("fp8 cvt16", "*fp8e4nv", tl.float16, 3, False), ("fp8 perm", "*u8", tl.float16, 4, False),
             ("fp8 cvtpx", "*u8", tl.float16, 5, False), ("fp8 cvtpx_k", "*u8", tl.float16, 5, True)]  # fmt: skip
    for name, pool, dot, mode, k_layout in pools:
        pointers = {"q_ptr": "*bf16", "k_cache_ptr": pool, "v_cache_ptr": pool, "block_tables_ptr": "*i32",
                    "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "out_ptr": "*bf16",
                    "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "ticket_ptr": "*i32"}  # fmt: skip
        for streams in (0, 1, 4) if name == "fp8 cvtpx" else (0,):  # the batched loop: 1 stream, one a warp
            constexprs = dict(common, DOT_DTYPE=dot, KV_FP8=mode, K_LOAD_LAYOUT=k_layout, KEY_STREAMS=streams,
                              EARLY_DEPENDENTS=name == "bf16")  # fmt: skip
            key = f"paged_decode {name}" + (f" streams{streams}" if streams else "")
            out[key] = _compile_for_hopper(fn, pointers, constexprs, aligned, num_warps=4, num_stages=3)
        if name in ("fp8 cvtpx", "bf16"):  # the transposed streams, as fp8kv11's grid launches them: 2 warps, 2 splits
            constexprs = dict(common, DOT_DTYPE=dot, KV_FP8=mode, K_LOAD_LAYOUT=k_layout, KEY_STREAMS=2,
                              TRANSPOSED=True, GROUP_PAD=8, BLOCK_N=32, NUM_SPLITS=2, SPLITS_PAD=2,
                              FUSED_MERGE=False)  # fmt: skip
            out[f"paged_decode {name} streams2t"] = _compile_for_hopper(fn, pointers, constexprs, aligned, num_warps=2,
                                                                         num_stages=3)  # fmt: skip
            # and over 2 neighbouring KV heads a program (`_attend_heads_t`), 16-key tiles, 4 splits
            constexprs = dict(constexprs, TRANSPOSED=False, HEAD_STREAMS=True, BLOCK_N=16, NUM_SPLITS=4, SPLITS_PAD=4)
            out[f"paged_decode {name} streams2h"] = _compile_for_hopper(fn, pointers, constexprs, aligned, num_warps=2,
                                                                         num_stages=2)  # fmt: skip
            # kv15: over 2 KV heads with 2 key streams of 16 a head (4 warps), one split
            constexprs = dict(constexprs, BLOCK_N=32, KEY_STREAMS=4, KEY_SUB=2, NUM_SPLITS=1, SPLITS_PAD=1)
            out[f"paged_decode {name} streams4h2"] = _compile_for_hopper(fn, pointers, constexprs, aligned,
                                                                          num_warps=4, num_stages=4)  # fmt: skip
            if name == "fp8 cvtpx":  # the lean loop (FLOTILLA_DECODE_FP8_LEAN) at the engine's tile and at 64 keys
                for block_n in (32, 64):
                    lean = dict(constexprs, BLOCK_N=block_n, LEAN=True)
                    out[f"paged_decode fp8 cvtpx streams4h2 lean{block_n}"] = _compile_for_hopper(
                        fn, pointers, lean, aligned, num_warps=4, num_stages=3)  # fmt: skip
    # batch 1's small launch: 128 splits of 32 keys, the fused merge in four chunks of 32 splits
    constexprs = dict(common, NUM_SPLITS=128, SPLITS_PAD=128, BLOCK_N=32, DOT_DTYPE=tl.bfloat16, KV_FP8=0,
                      K_LOAD_LAYOUT=False, KEY_STREAMS=0, EARLY_DEPENDENTS=False)  # fmt: skip
    bf16 = pointers | {"k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16"}
    out["paged_decode bf16 fused128"] = _compile_for_hopper(fn, bf16, constexprs, aligned, num_warps=4, num_stages=2)
    # ... started early by PDL (waits for the kernel ahead), its 128 keys and values prefetched into L2
    constexprs |= dict(EARLY_START=True, EARLY_DEPENDENTS=True, PREFETCH_TOKENS=128, LINE_ELEMS=64)
    out["paged_decode bf16 early"] = _compile_for_hopper(fn, bf16, constexprs, aligned, num_warps=4, num_stages=2)
    # the engine's small launch (64-key tiles, 4 warps, 3 stages, 17 splits of 256 keys, fused merge), plain and with
    # the early query (FLOTILLA_DECODE_EARLY_QUERY)
    constexprs = dict(common, NUM_SPLITS=17, SPLITS_PAD=32, DOT_DTYPE=tl.bfloat16, KV_FP8=0, K_LOAD_LAYOUT=False,
                      KEY_STREAMS=0, EARLY_DEPENDENTS=True)  # fmt: skip
    out["paged_decode bf16 small"] = _compile_for_hopper(fn, bf16, constexprs, aligned, num_warps=4, num_stages=3)
    # ... with its splits' pages read up front (flag "pages": 4 tiles of 64 keys a split)
    out["paged_decode bf16 small pages"] = _compile_for_hopper(fn, bf16, constexprs | dict(SPLIT_TILES=4), aligned,
                                                               num_warps=4, num_stages=3)  # fmt: skip
    constexprs |= dict(EARLY_QUERY=True)
    out["paged_decode bf16 early query"] = _compile_for_hopper(fn, bf16, constexprs, aligned, num_warps=4,
                                                                num_stages=3)  # fmt: skip
    # the split merge as launched by programmatic dependent launch after the bf16 decode above
    from flotilla.kernels.triton_split_merge import split_merge_kernel

    merge = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
             "out_ptr": "*bf16"}  # fmt: skip
    consts = dict(NUM_HEADS=32, NUM_SPLITS=32, SPLITS_PAD=32, HEAD_DIM=128, BLOCK_D=128, ROWS_ARE_SEQS=True, PDL=True,
                  ACTIVE_ONLY=True)  # fmt: skip
    out["split_merge pdl"] = _compile_for_hopper(split_merge_kernel, merge, consts, num_warps=4)
    return out


def _compile_lora() -> dict[str, dict[str, object]]:
    """The LoRA kernels a Llama-3.1-8B decode step at batch 64 with 8 slots launches (kernel set
    "stacked"): the per-step token grouping, and the stacked expand (16-token segment blocks, 128
    columns, rank 16, bf16 on tensor cores)."""
    import triton.language as tl

    from flotilla.kernels.triton_lora_segments import _segments_kernel
    from flotilla.kernels.triton_lora_stacked import _stacked_expand_kernel

    segments = {"slots_ptr": "*i64", "order_ptr": "*i32", "starts_ptr": "*i32"}
    expand = {"out_ptr": "*bf16", "ext_ptr": "*bf16", "b_ptr": "*bf16", "order_ptr": "*i32", "starts_ptr": "*i32"}
    consts = dict(DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", BLOCK_M=16, BLOCK_N=128, BLOCK_R=16, BLOCK_S=16)
    return {
        "lora_segments bf16": _compile_for_hopper(_segments_kernel, segments, dict(BLOCK_T=64, BLOCK_S=16)),
        "lora_stacked_expand bf16": _compile_for_hopper(_stacked_expand_kernel, expand, consts),
    }


def _compile_int4() -> dict[str, dict[str, object]]:
    """The int4 kernels as the dispatch launches them for Llama-3.1-8B: the W4A16 GEMV's FMA path at
    one row (symmetric, no split) and at four rows (zero points, split-K partials) and its tensor-core
    path, the `tl.dot` GEMM with 64-row tiles and the one-pass dequantization."""
    import triton.language as tl

    from flotilla.kernels.triton_int4_gemm import _int4_dequant_kernel, _int4_gemm_kernel
    from flotilla.kernels.triton_int4_gemv import _int4_gemv_dot_kernel, _int4_gemv_kernel

    pointers = {"x_ptr": "*bf16", "packed_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*u8", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "part_ptr": "*fp32", "counter_ptr": "*i32"}  # fmt: skip
    gemv = dict(GROUP=128, HAS_ZEROS=False, HAS_BIAS=False, SPLIT_K=1, FIXUP=False, BLOCK_M=1, BLOCK_N=16, BLOCK_W=64,
                NUM_STAGES=1, EVEN=True)  # fmt: skip
    gemv4 = dict(gemv, HAS_ZEROS=True, SPLIT_K=2, FIXUP=True, BLOCK_M=4, BLOCK_N=8, EVEN=False)
    dot = dict(GROUP=128, HAS_ZEROS=True, HAS_BIAS=True, SPLIT_K=4, FIXUP=True, BLOCK_M=16, BLOCK_N=128, NUM_STAGES=3,
               DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", EVEN_N=True)  # fmt: skip
    gemm = dict(GROUP=128, HAS_BIAS=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, DOT_DTYPE=tl.bfloat16,
                DOT_PRECISION="tf32")  # fmt: skip
    from flotilla.kernels.triton_int4_gemv_wide import _int4_gemv_wide_kernel

    wide_ptrs = dict(pointers, x_ptr="*i64")  # activations read as 8-byte units
    aligned = ("x_ptr", "packed_ptr", "scales_ptr", "stride_xm", "stride_pn", "KW", "words_per_split")
    wide = dict(GROUP=128, HAS_ZEROS=False, HAS_BIAS=False, SPLIT_K=1, FIXUP=False, ROWS=1, BLOCK_M=1, BLOCK_N=16,
                BLOCK_W=128, NUM_STAGES=3, X_KIND=0, USE_ASM=True, EVEN=True)  # fmt: skip
    wide4 = dict(wide, HAS_ZEROS=True, HAS_BIAS=True, SPLIT_K=2, FIXUP=True, ROWS=4, BLOCK_M=4, NUM_STAGES=1)
    # FLOTILLA_INT4_WIDE_PDL's launch at the measured one-row tile (split-K 2 with arrival counters, one stage)
    wide_pdl = dict(wide, SPLIT_K=2, FIXUP=True, NUM_STAGES=1, PDL=True, TRIGGER_LATE=0)
    # the fused one-row forms (`triton_int4_gemv_fused.py`) at the measured tiles by PDL: gate/up + SiLU (one range),
    # qkv + rotary + KV write (split-K 2: the last range's fixup runs the epilogue)
    from flotilla.kernels.triton_int4_gemv_fused import _int4_gated_kernel, _int4_rope_kernel

    fused = {k: v for k, v in wide_pdl.items() if k not in ("FIXUP", "ROWS", "BLOCK_M")} | {"LAYOUT": 1}
    rope_ptrs = dict(wide_ptrs, positions_ptr="*i64", cos_sin_ptr="*fp32", slot_mapping_ptr="*i64",
                     q_out_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16")  # fmt: skip
    rope = dict(fused, HEAD_DIM=128, PAGE=16, FP8_CACHE=False)
    return {
        "int4_gemv_wide gated pdl": _compile_for_hopper(_int4_gated_kernel, wide_ptrs, dict(fused, SPLIT_K=1),
                                                        aligned, num_warps=4, num_stages=1),
        "int4_gemv_wide rope pdl": _compile_for_hopper(_int4_rope_kernel, rope_ptrs, rope, aligned, num_warps=4,
                                                       num_stages=1),
        "int4_gemv_wide m1 pdl": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs, wide_pdl, aligned, num_warps=4,
                                                     num_stages=1),
        "int4_gemv_wide m1 pdl late": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs,
                                                          dict(wide_pdl, TRIGGER_LATE=1), aligned, num_warps=4,
                                                          num_stages=1),
        # LAYOUT 1 (the [rows, words] word tile, PTX scale loads), by PDL
        "int4_gemv_wide m1 rows pdl": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs, dict(wide_pdl, LAYOUT=1),
                                                          aligned, num_warps=4, num_stages=1),
        # FLOTILLA_INT4_WIDE_MMA: the tensor-core step (`triton_int4_mma.py`) at the same launches
        "int4_gemv_wide m1 rows pdl mma": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs,
                                                              dict(wide_pdl, LAYOUT=1, MMA=True), aligned, num_warps=4,
                                                              num_stages=1),
        "int4_gemv_wide gated pdl mma": _compile_for_hopper(_int4_gated_kernel, wide_ptrs,
                                                            dict(fused, SPLIT_K=1, MMA=True), aligned, num_warps=4,
                                                            num_stages=1),
        "int4_gemv_wide m1": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs, wide, aligned, num_warps=4,
                                                 num_stages=3),
        "int4_gemv_wide m4": _compile_for_hopper(_int4_gemv_wide_kernel, wide_ptrs, wide4, aligned, num_warps=4,
                                                 num_stages=1),
        "int4_gemv m1": _compile_for_hopper(_int4_gemv_kernel, pointers, gemv, num_warps=4),
        "int4_gemv m4": _compile_for_hopper(_int4_gemv_kernel, pointers, gemv4, num_warps=4),
        "int4_gemv dot": _compile_for_hopper(_int4_gemv_dot_kernel, pointers, dot, num_warps=4, num_stages=3),
        "int4_gemm m64": _compile_for_hopper(_int4_gemm_kernel, pointers, gemm, num_warps=4),
        "int4_dequant": _compile_for_hopper(_int4_dequant_kernel, pointers, dict(GROUP=128, BLOCK_N=32, BLOCK_K=128)),
    }


def _compile_fp8_gemv() -> dict[str, dict[str, object]]:
    """The W8A16 GEMV as the dispatch launches it for Llama-3.1-8B: the FMA path at one row (fp8 tile
    upcast to fp32) and the `tl.dot` path at 16 rows with split-K partials (upcast to bf16)."""
    import triton.language as tl

    from flotilla.kernels.triton_gemv import _gemv_kernel

    pointers = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "part_ptr": "*fp32",  # the LoRA epilogue's (unused without LORA_SLICES):
                "lora_part_ptr": "*fp32", "lora_b_ptr": "*bf16", "lora_slots_ptr": "*i32"}  # fmt: skip
    common = dict(HAS_SCALE=True, HAS_BIAS=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", LORA_SLICES=0,
                  LORA_BLOCK_R=16, LORA_BLOCK_S=2)  # fmt: skip
    fma = dict(common, SPLIT_K=1, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, NUM_STAGES=3)
    dot = dict(common, SPLIT_K=2, USE_DOT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4)
    from flotilla.kernels.triton_fp8_quant import _quant_rows_kernel

    quant = {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "static_scale_ptr": "*fp32"}
    return {
        "fp8_gemv fma m1": _compile_for_hopper(_gemv_kernel, pointers, fma, num_warps=4, num_stages=3),
        "fp8_gemv dot m16": _compile_for_hopper(_gemv_kernel, pointers, dot, num_warps=4, num_stages=4),
        # the block-scaled forms (`fp8_gemv_block`, 128 x 128 blocks): the scales applied in the K loop
        "fp8_gemv fma m2 block": _compile_for_hopper(_gemv_kernel, pointers, dict(
            fma, BLOCK_M=2, HAS_SCALE=False, SCALE_BN=128, SCALE_BK=128), num_warps=4, num_stages=3),
        "fp8_gemv dot m16 block": _compile_for_hopper(_gemv_kernel, pointers, dict(
            dot, HAS_SCALE=False, SCALE_BN=128, SCALE_BK=128), num_warps=4, num_stages=4),
        "fp8_quant_rows": _compile_for_hopper(_quant_rows_kernel, quant, dict(
            STATIC=False, BLOCK_K=2048, QMIN=-448.0, QMAX=448.0, ROUND_INT=False)),
    }


def _compile_fp8_block_linear() -> dict[str, dict[str, object]]:
    """The block-scaled fp8 GEMM (`triton_fp8_block_linear.py`) at its default tiles in 128 x 128 blocks: decode
    (16 x 64 x 128 swap AB, split-K partials), 64 rows (64 x 64 x 128) and prefill (128 x 128 x 64)."""
    import triton.language as tl

    from flotilla.kernels.triton_fp8_block_linear import _fp8_block_kernel

    fn = _fp8_block_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("K", "stride_xm", "stride_wn", "stride_om",
                                                                             "k_per_split"))
    pointers = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16",
                "part_ptr": "*fp32"}
    common = dict(SCALE_BN=128, SCALE_BK=128, HAS_BIAS=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32")
    decode = dict(common, SPLIT_K=5, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4, SWAP_AB=True)
    rows64 = dict(common, SPLIT_K=1, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4)
    prefill = dict(common, SPLIT_K=1, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_STAGES=3)
    return {"fp8_block decode": _compile_for_hopper(fn, pointers, decode, aligned, num_warps=4, num_stages=4),
            "fp8_block m64": _compile_for_hopper(fn, pointers, rows64, aligned, num_warps=4, num_stages=4),
            "fp8_block prefill": _compile_for_hopper(fn, pointers, prefill, aligned, num_warps=8, num_stages=3)}


def _compile_gemv_rope() -> dict[str, dict[str, object]]:
    """The one-row qkv GEMV with rotary + KV write in its epilogue (`triton_gemv_rope.py`) at Llama-3.1-8B's shape
    (16-row tiles of 8 pairs, 512-wide K steps, 2 stages): plain, by PDL, and into an fp8 cache."""
    from flotilla.kernels.triton_gemv_rope import _gemv_rope_kernel

    fn = _gemv_rope_kernel
    aligned = tuple(n for n in _arg_names(fn) if n.endswith("_ptr") or n in ("N", "K", "stride_wn"))
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "positions_ptr": "*i64",
                "cos_sin_ptr": "*fp32", "slot_mapping_ptr": "*i64", "q_out_ptr": "*bf16", "k_cache_ptr": "*bf16",
                "v_cache_ptr": "*bf16"}  # fmt: skip
    consts = dict(HAS_BIAS=False, HEAD_DIM=128, PAGE=16, FP8_CACHE=False, BLOCK_N=16, BLOCK_K=512, NUM_STAGES=2)
    fp8 = dict(pointers, k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv")
    launch = dict(num_warps=4, num_stages=2)
    return {
        "gemv_rope bf16 m1": _compile_for_hopper(fn, pointers, consts, aligned, **launch),
        "gemv_rope bf16 m1 pdl": _compile_for_hopper(fn, pointers, dict(consts, PDL=True), aligned, **launch),
        "gemv_rope bf16 m1 bias *fp8e4nv": _compile_for_hopper(fn, fp8, dict(consts, HAS_BIAS=True, FP8_CACHE=True),
                                                               aligned, **launch),
    }


def _cuda_backend_missing() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return True
    return False


def _compile_gated_gemv() -> dict[str, dict[str, object]]:
    """The one-row gated GEMV (`triton_gated_gemv.py`) at Llama-3.1-8B's gate/up launch (its one-row default, the
    H200 sweep's winner: 4 + 4 rows x 512 K, 4 warps, 3 stages), plain and launched by PDL (its first gate and up
    tiles loaded before the wait)."""
    from flotilla.kernels.triton_gated_gemv import _gated_gemv_kernel, default_config

    fn = _gated_gemv_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("N", "K", "stride_xm", "stride_wn"))
    pointers = {name: "*bf16" for name in ("x_ptr", "w_ptr", "bias_ptr", "out_ptr")}
    cfg = default_config(1, 14336, 4096, 132)
    consts = dict(HAS_BIAS=False, BLOCK_M=1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages)
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return {name: _compile_for_hopper(fn, pointers, dict(consts, **extra), aligned, **launch)
            for name, extra in (("gated_gemv bf16 m1", {}), ("gated_gemv bf16 m1 pdl", dict(PDL=True)))}


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_gated_gemv_compiles_for_hopper(compiled):
    """The one-row gated GEMV alone (this file run as a script with `gated`): FMA work in 16-byte weight loads;
    launched by PDL one wait and one trigger, with weight loads before the wait."""
    result = compiled("gated")
    gated, gated_pdl = result["gated_gemv bf16 m1"], result["gated_gemv bf16 m1 pdl"]
    assert gated["cubin_bytes"] > 0 and gated_pdl["cubin_bytes"] > 0
    assert not gated["mma"] and gated["loads16"] > 0 and gated["gdc_wait"] == 0 and gated["gdc_launch"] == 0
    assert gated_pdl["gdc_wait"] == 1 and gated_pdl["gdc_launch"] == 1 and gated_pdl["loads_before_wait"] > 0


def _compile_fp8_row_gemv() -> dict[str, dict[str, object]]:
    """The one-row fp8 GEMV (`triton_fp8_row_gemv.py`) at Llama-3.1-8B's qkv and gated gate/up launches (default
    configs), plain and launched by PDL (trigger at the top, and after the K loop), and its qkv rope form (bf16 and
    fp8 caches, plain and PDL)."""
    from flotilla.kernels.triton_fp8_row_gemv import _fp8_row_gemv_kernel, default_config

    fn = _fp8_row_gemv_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("N", "KW", "stride_wn"))
    pointers = {"x_ptr": "*i64", "w_ptr": "*i32", "scale_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
    out = {}
    for name, n, gated in (("qkv", 6144, False), ("gated", 14336, True)):
        cfg = default_config(n, 4096, 132, gated=gated)
        consts = dict(HAS_BIAS=False, GATED=gated, BF16=True, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      PREFETCH=cfg.prefetch, EVEN_K=True)  # fmt: skip
        for tag, extra in (("", {}), (" pdl", dict(PDL=True)), (" pdl late", dict(PDL=True, TRIGGER=1))):
            out[f"fp8_row_gemv {name}{tag}"] = _compile_for_hopper(fn, pointers, dict(consts, **extra), aligned,
                                                                   num_warps=cfg.num_warps, num_stages=1)  # fmt: skip
    # the block-scaled form (`fp8_row_gemv_block`) at qkv's tiles in 128 x 128 blocks, plain and by PDL
    cfg = default_config(6144, 4096, 132)
    block = dict(HAS_BIAS=False, GATED=False, BF16=True, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                 PREFETCH=cfg.prefetch, EVEN_K=True, SCALE_BN=128, SCALE_WORDS=32)  # fmt: skip
    for tag, extra in (("", {}), (" pdl", dict(PDL=True))):
        out[f"fp8_row_gemv qkv block{tag}"] = _compile_for_hopper(fn, pointers, dict(block, **extra), aligned,
                                                                  num_warps=cfg.num_warps, num_stages=1)  # fmt: skip
    # the qkv form with the rotary + KV-write epilogue (bf16 and fp8 caches)
    from flotilla.kernels.triton_fp8_row_gemv import _fp8_row_gemv_rope_kernel

    fn = _fp8_row_gemv_rope_kernel
    aligned = tuple(n for n in _arg_names(fn) if n.endswith("_ptr") or n in ("N", "KW", "stride_wn"))
    cfg = default_config(6144, 4096, 132)
    consts = dict(HAS_BIAS=False, BF16=True, HEAD_DIM=128, PAGE=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  PREFETCH=cfg.prefetch, EVEN_K=True)  # fmt: skip
    for cache in ("bf16", "fp8e4nv"):
        ptrs = pointers | {"positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_mapping_ptr": "*i64",
                           "q_out_ptr": "*bf16", "k_cache_ptr": f"*{cache}", "v_cache_ptr": f"*{cache}"}  # fmt: skip
        for tag, extra in (("", {}), (" pdl", dict(PDL=True))):
            out[f"fp8_row_gemv rope {cache}{tag}"] = _compile_for_hopper(
                fn, ptrs, dict(consts, FP8_CACHE=cache != "bf16", **extra), aligned, num_warps=cfg.num_warps,
                num_stages=1)  # fmt: skip
    return out


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_fp8_row_gemv_compiles_for_hopper(compiled):
    """The one-row fp8 GEMV (this file run as a script with `fp8row`): the e4m3 pairs by the hardware cvt (inline
    PTX), FMA only, 16-byte weight loads straight to registers (no cp.async, no byte reads from shared memory);
    by PDL one wait and one trigger, the first tiles loaded before the wait (both trigger positions)."""
    result = compiled("fp8row")
    for name, r in result.items():
        assert r["cubin_bytes"] > 0 and r["e4m3_cvt"] and not r["mma"] and r["byte_smem_reads"] == 0, name
        assert r["loads16"] >= (8 if "gated" in name else 4), name  # 2 tiles (x2 gated) of 16-byte words a thread
        pdl = "pdl" in name
        assert (r["gdc_wait"], r["gdc_launch"]) == ((1, 1) if pdl else (0, 0)), name
        assert not pdl or r["loads_before_wait"] >= (8 if "gated" in name else 4), name


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_fp8_block_linear_compiles_for_hopper(compiled):
    """The block GEMM's e4m3 tiles convert in hardware and multiply on the tensor cores at its default tiles; the
    prefill tile (128 rows) on Hopper's warpgroup MMA."""
    result = compiled("fp8block")
    for name in ("fp8_block decode", "fp8_block m64", "fp8_block prefill"):
        assert result[name]["cubin_bytes"] > 0 and result[name]["e4m3_cvt"] and result[name]["mma"], name
    assert result["fp8_block prefill"]["wgmma"]


def test_fp8_kernels_compile_for_hopper(compiled):
    result = compiled("all-a") | compiled("all-b")  # `_compile_all`'s two parts
    assert all(r["cubin_bytes"] > 0 for r in result.values())
    # the fp32 -> e4m3 stores and the GEMV's e4m3 loads use the hardware conversions (cvt ... e4m3x2),
    # not a software one
    plain = ("int4", "paged_decode", "split_merge")  # int4: no fp8; the decode kernel: checked below
    assert all(r["e4m3_cvt"] for name, r in result.items() if "bf16" not in name and not name.startswith(plain))
    assert result["lora_stacked_expand bf16"]["mma"]  # the LoRA delta on tensor cores
    assert result["fp8_gemv dot m16"]["mma"] and not result["fp8_gemv fma m1"]["mma"]
    assert result["fp8_gemv dot m16 block"]["mma"] and not result["fp8_gemv fma m2 block"]["mma"]
    # the qkv GEMV with the rotary + KV-write epilogue: FMA, 16-byte weight loads like the plain GEMV's; by PDL one
    # wait and one trigger, the first weight tile loaded before the wait
    rope, rope_pdl = result["gemv_rope bf16 m1"], result["gemv_rope bf16 m1 pdl"]
    assert not rope["mma"] and rope["loads16"] >= result["gemv bf16 m1"]["loads16"] > 0 and rope["gdc_wait"] == 0
    assert rope_pdl["gdc_wait"] == 1 and rope_pdl["gdc_launch"] == 1 and rope_pdl["loads_before_wait"] > 0
    # the int4 GEMV is FMA work (no MMA), with no int->float conversion nor shared-memory round trip per
    # nibble plane (the layout conversion a vectorised word load caused); the GEMM feeds the tensor cores
    assert not result["int4_gemv m1"]["mma"] and result["int4_gemm m64"]["mma"] and result["int4_gemv dot"]["mma"]
    assert not result["int4_gemv m1"]["i2f"] and result["int4_gemv m1"]["bar_sync"] <= 4
    # The wide GEMV: weights in 16-byte loads (cp.async through the pipeline's buffers at 3 stages, ld.global.v4
    # at 1), one lop3 a nibble (PTX), FMA only, and no shared-memory layout conversion in the loop (the 3-stage
    # pipeline's own barriers only).
    for name, r in ((n, result[n]) for n in ("int4_gemv_wide m1", "int4_gemv_wide m4")):
        assert r["loads16"] >= 4 and r["lop3"] >= 8 and not r["mma"] and not r["i2f"], (name, r)
    assert result["int4_gemv_wide m1"]["bar_sync"] <= 4 and result["int4_gemv_wide m4"]["atomics"]
    # by PDL (FLOTILLA_INT4_WIDE_PDL): one wait, one trigger (before the wait, or after the loop with "late"), the
    # first step's 16-byte word loads (4 a thread at 16 x 128 words) and its scales before the wait
    for name, before in (("int4_gemv_wide m1 pdl", 1), ("int4_gemv_wide m1 pdl late", 0),
                         ("int4_gemv_wide m1 rows pdl", 1)):
        r = result[name]
        assert r["gdc_wait"] == 1 and r["gdc_launch"] == 1 and r["launch_before_wait"] == before, (name, r)
        assert r["loads16_before_wait"] >= 4 and r["loads_before_wait"] > r["loads16_before_wait"], (name, r)
    assert result["int4_gemv_wide m1"]["gdc_wait"] == 0 and result["int4_gemv_wide m1"]["gdc_launch"] == 0
    # the fused forms keep the wide GEMV's loop (16-byte words, PTX nibbles, FMA) and its PDL peel; the rope form's
    # split-K fixup counts arrivals
    for name in ("int4_gemv_wide gated pdl", "int4_gemv_wide rope pdl"):
        r = result[name]
        assert r["loads16"] >= 4 and r["lop3"] >= 8 and not r["mma"] and not r["i2f"], (name, r)
        assert r["gdc_wait"] == 1 and r["gdc_launch"] == 1 and r["loads16_before_wait"] >= 4, (name, r)
    assert result["int4_gemv_wide rope pdl"]["atomics"] and not result["int4_gemv_wide gated pdl"]["atomics"]
    rows = result["int4_gemv_wide m1 rows pdl"]  # its loop's SASS (449 instructions under 3.6): bench/sass_loop.py
    assert rows["lop3"] >= 8 and not rows["mma"] and not rows["i2f"], rows
    # the tensor-core step: mma.sync on register operands (no shared memory: the pipeline's barriers only), one lop3
    # per two weights (its loop: 221 SASS instructions a 16 x 128 step against 449 under 3.6, bench/sass_loop.py), the
    # PDL peel kept
    for name, fma in (("int4_gemv_wide m1 rows pdl mma", rows),
                      ("int4_gemv_wide gated pdl mma", result["int4_gemv_wide gated pdl"])):
        r = result[name]
        assert r["mma"] and not r["wgmma"] and not r["i2f"] and r["bar_sync"] <= fma["bar_sync"], (name, r)
        assert 0 < 2 * r["lop3"] <= fma["lop3"] and r["gdc_wait"] == 1 and r["loads16_before_wait"] >= 4, (name, r)
    # The decode kernel's fp8 bit-move paths neither convert with cvt nor read V back from shared memory
    # byte by byte (Triton's own upcast does both: issue 22's slow fp8 pool).
    for name in ("paged_decode fp8 asm", "paged_decode fp8 bits"):
        assert result[name]["mma"] and not result[name]["e4m3_cvt"] and result[name]["byte_smem_reads"] == 0, name
    assert result["paged_decode fp8 cvt"]["byte_smem_reads"] > 0  # what the probe looks for still shows up
    assert result["paged_decode fp8 cvt16"]["e4m3_cvt"] and result["paged_decode fp8 cvt16"]["byte_smem_reads"] == 0
    assert result["paged_decode bf16"]["byte_smem_reads"] == 0
    for name in ("paged_decode bf16 streams2t", "paged_decode bf16 streams2h", "paged_decode bf16 streams4h2"):
        assert result[name]["mma"] and result[name]["byte_smem_reads"] == 0, name
    # The impure asm keeps V in its load layout without a select per value (asm: a selp a value pair);
    # the hardware cvt in PTX converts; with K in its load layout too, the query comes by ldmatrix.
    for name in ("paged_decode fp8 perm", "paged_decode fp8 cvtpx", "paged_decode fp8 cvtpx_k",
                 "paged_decode fp8 cvtpx streams1", "paged_decode fp8 cvtpx streams4",
                 "paged_decode fp8 cvtpx streams2t", "paged_decode fp8 cvtpx streams2h",
                 "paged_decode fp8 cvtpx streams4h2", "paged_decode fp8 cvtpx streams4h2 lean32",
                 "paged_decode fp8 cvtpx streams4h2 lean64"):  # fmt: skip
        assert result[name]["mma"] and result[name]["byte_smem_reads"] == 0, name
        assert result[name]["selp"] < result["paged_decode fp8 asm"]["selp"] - 32, name
    assert not result["paged_decode fp8 perm"]["e4m3_cvt"] and result["paged_decode fp8 cvtpx"]["e4m3_cvt"]
    # the lean loop: an unmasked loop over the full tiles and a masked one for the last, so more 16-byte loads and
    # fewer selects than the masked loop alone (its SASS per key: docs/quantization.md)
    plain, lean = result["paged_decode fp8 cvtpx streams4h2"], result["paged_decode fp8 cvtpx streams4h2 lean32"]
    assert lean["loads16"] > plain["loads16"] and lean["e4m3_cvt"], (lean, plain)
    assert result["paged_decode fp8 cvtpx_k"]["ldmatrix"] > result["paged_decode fp8 cvtpx"]["ldmatrix"]
    # the early query: its loads before the inactive split's return (the plain kernel's come after it)
    query = result["paged_decode bf16 early query"]
    assert query["mma"] and query["loads2_before_branch"] > 0, query
    assert result["paged_decode bf16 small"]["loads2_before_branch"] == 0
    # flag "pages": the key loop's page-table reads gone (sm_90, Triton 3.9: 54 global loads against 84), same mma
    pages, small = result["paged_decode bf16 small pages"], result["paged_decode bf16 small"]
    assert pages["mma"] and pages["atomics"] and pages["loads"] < small["loads"] - 16, (pages, small)
    # the batch-1 merge by programmatic dependent launch: the split kernel lets it start, it waits
    assert result["paged_decode bf16"]["gdc_launch"] == 1 and result["paged_decode fp8 asm"]["gdc_launch"] == 0
    assert result["split_merge pdl"]["gdc_wait"] == 1 and result["split_merge pdl"]["gdc_launch"] == 1
    # the batch-1 chain by PDL: one wait and one trigger each; the GEMV loads its first weight tile before the
    # wait (and, with the L2 prefetch, issues bulk prefetches); the plain GEMV has neither instruction
    for name in ("gemv bf16 m1 pdl", "gemv bf16 m1 pdl l2", "fp8_gemv fma m1 pdl", "rms_norm bf16 pdl",
                 "silu_and_mul bf16 pdl", "rotary_kv_write bf16 pdl", "l2_prefetch bf16"):  # fmt: skip
        assert result[name]["gdc_wait"] == 1 and result[name]["gdc_launch"] == 1, name
    for name in ("gemv bf16 m1 pdl", "gemv bf16 m1 pdl l2", "fp8_gemv fma m1 pdl"):
        assert result[name]["loads_before_wait"] > 0, name
    assert result["rms_norm bf16 pdl"]["loads_before_wait"] == 0
    assert result["gemv bf16 m1 pdl l2"]["l2_prefetch"] > 0 and result["gemv bf16 m1 pdl"]["l2_prefetch"] == 0
    assert result["l2_prefetch bf16"]["l2_prefetch"] > 0
    assert result["gemv bf16 m1"]["gdc_wait"] == 0 and result["gemv bf16 m1"]["gdc_launch"] == 0
    # the fused merge: the arrival ticket is an atomic, the partials are read through L2
    assert result["paged_decode bf16"]["atomics"] and result["paged_decode bf16 fused128"]["atomics"]
    # started early, it waits for the kernel ahead once and prefetches K and V (128 tokens x 2 lines each)
    early = result["paged_decode bf16 early"]
    assert early["gdc_wait"] == 1 and early["gdc_launch"] == 1 and early["prefetch"] >= 2
    plain = result["paged_decode bf16 fused128"]
    assert plain["prefetch"] == 0 and plain["gdc_wait"] == 0
    # the skinny GEMM runs on Hopper's asynchronous tensor cores; only the split-K fix-up takes atomics
    assert all(r["wgmma"] for name, r in result.items() if name.startswith("skinny_gemm"))
    assert result["skinny_gemm bf16 tma split"]["tma"] and not result["skinny_gemm bf16 split"]["tma"]
    assert not result["skinny_gemm bf16"]["atomics"] and result["skinny_gemm bf16 split"]["atomics"]


def _compile_prefill() -> dict[str, dict[str, object]]:
    """The prefill kernel at Llama-3.1-8B's heads (GQA 4, head_dim 128, 16-token pages, bf16) in its loop forms: the
    old loop, the lean one (FLOTILLA_PREFILL_LEAN), lazy rescaling (FLOTILLA_PREFILL_LAZY_RESCALE) on each, the
    lean one with the reciprocal normalisation (FLOTILLA_PREFILL_RECIPROCAL) or the listed tile map
    (FLOTILLA_PREFILL_DEAD_LAST), at the default launch (128-row tiles of 32 keys, 4 warps, 3 stages) and the lean
    loop at 64 keys with 8 warps; the extend's split launch with and without the live splits and the PDL merge, and
    its merges."""
    import triton.language as tl

    from flotilla.kernels.triton_paged_prefill import _prefill_kernel

    fn = _prefill_kernel
    pointers = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "block_tables_ptr": "*i32",
                "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "tile_seq_ptr": "*i64",
                "tile_start_ptr": "*i64", "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride_"))
    common = dict(GROUP=4, HEADS_PER_TILE=4, TOKENS_PER_TILE=32, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_M=128,
                  BLOCK_N=32, NUM_HEADS=32, NUM_SPLITS=1, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32")
    forms = {"old": dict(LEAN=False), "lean": dict(LEAN=True, SHARED_KV=True),
             "old lazy": dict(LEAN=False, RESCALE_TAU=8.0),
             "lean lazy": dict(LEAN=True, SHARED_KV=True, RESCALE_TAU=8.0),
             "lean rcp": dict(LEAN=True, SHARED_KV=True, RECIPROCAL=True)}
    out = {f"prefill {name}": _compile_for_hopper(fn, pointers, common | form, aligned, num_warps=4, num_stages=3)
           for name, form in forms.items()}  # fmt: skip
    listed = pointers | {"tile_seq_ptr": "*i32", "tile_start_ptr": "*i32"}  # tile_map(dead_last=True)'s int32 list
    out["prefill lean listed"] = _compile_for_hopper(fn, listed, common | forms["lean"] | dict(DEAD_LAST=True), aligned,
                                                     num_warps=4, num_stages=3)  # fmt: skip
    out["prefill lean n64 w8"] = _compile_for_hopper(fn, pointers, common | forms["lean"] | dict(BLOCK_N=64), aligned,
                                                     num_warps=8, num_stages=3)  # fmt: skip
    # the extend's split launch (`SPLIT_LAUNCH`: 64-key tiles, 8 warps, 3 stages, 16 splits, the listed map), plain
    # and with the live splits (FLOTILLA_EXTEND_LIVE_SPLITS), and their token-row merges
    split = common | forms["lean"] | dict(BLOCK_N=64, NUM_SPLITS=16, DEAD_LAST=True)
    for name, live, pdl in (("split", False, False), ("split live", True, False), ("split live pdl", True, True)):
        out[f"prefill {name}"] = _compile_for_hopper(fn, listed, split | dict(LIVE_SPLITS=live, EARLY_DEPENDENTS=pdl),
                                                     aligned, num_warps=8, num_stages=3)  # fmt: skip
    from flotilla.kernels.triton_split_merge import split_merge_kernel

    merge = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
             "out_ptr": "*bf16"}  # fmt: skip
    consts = dict(NUM_HEADS=32, NUM_SPLITS=16, SPLITS_PAD=16, HEAD_DIM=128, BLOCK_D=128, ROWS_ARE_SEQS=False)
    for name, live, pdl in (("merge", False, False), ("merge live", True, False), ("merge live pdl", True, True)):
        out[f"prefill {name}"] = _compile_for_hopper(split_merge_kernel, merge, consts | dict(LIVE_ONLY=live, PDL=pdl),
                                                     ("part_out_ptr", "out_ptr", "stride_ot", "stride_oh"),
                                                     num_warps=4)  # fmt: skip
    return out


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_prefill_loop_forms_compile_for_hopper(compiled):
    """The prefill kernel's loop forms (this file run as a script with `prefill`) compile for sm_90 on Hopper's
    asynchronous tensor cores; the lean loop is the smaller kernel (its SASS, bench/sass_loop.py under Triton 3.6:
    3,152 instructions against 4,224)."""
    result = compiled("prefill")
    assert all(r["cubin_bytes"] > 0 and (r["wgmma"] or "merge" in name) for name, r in result.items()), result
    assert result["prefill lean"]["cubin_bytes"] < 0.9 * result["prefill old"]["cubin_bytes"]
    assert result["prefill lean lazy"]["cubin_bytes"] < result["prefill old lazy"]["cubin_bytes"]
    assert result["prefill lean rcp"]["cubin_bytes"] < result["prefill lean"]["cubin_bytes"]
    # the live splits (FLOTILLA_EXTEND_LIVE_SPLITS) load what the plain split launch loads; their merge adds one
    # load (the step's token count) and still reads the partials 16 bytes at a time
    assert result["prefill split live"]["loads"] == result["prefill split"]["loads"]
    merge, live = result["prefill merge"], result["prefill merge live"]
    assert live["loads"] == merge["loads"] + 1 and live["loads16"] == merge["loads16"] > 0
    # FLOTILLA_EXTEND_PDL_MERGE: the split programs let the merge start; the merge waits before its first load
    assert result["prefill split live pdl"]["gdc_launch"] == 1 and result["prefill split live"]["gdc_launch"] == 0
    pdl = result["prefill merge live pdl"]
    assert pdl["gdc_wait"] == 1 and pdl["loads_before_wait"] == 0 and live["gdc_wait"] == 0


def _compile_fused_moe() -> dict[str, dict[str, object]]:
    """The fused MoE's grouped GEMM (`triton_fused_moe.py`) at its default tiles, bf16 activations over bf16 or fp8
    experts (W8A16, per-row scales): the gate/up form (rows gathered by token) and the down form (each row weighted
    by its router weight)."""
    import triton.language as tl

    from flotilla.kernels.triton_fused_moe import _grouped_gemm_kernel

    fn = _grouped_gemm_kernel
    aligned = tuple(n for n in fn.arg_names if n.endswith("_ptr") or n in ("n", "k") or n.startswith("stride_"))
    pointers = {"a_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "sorted_pairs_ptr": "*i64",
                "block_experts_ptr": "*i64", "weights_ptr": "*fp32", "w_scale_ptr": "*fp32"}
    common = dict(DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", BLOCK_M=16, BLOCK_N=64, BLOCK_K=32)
    forms = (("fused_moe gate_up bf16", 8, False, "*bf16"), ("fused_moe down bf16", 1, True, "*bf16"),
             ("fused_moe gate_up fp8", 8, False, "*fp8e4nv"), ("fused_moe down fp8", 1, True, "*fp8e4nv"))
    return {name: _compile_for_hopper(fn, pointers | {"w_ptr": w_type},
                                      dict(common, A_ROW_DIV=div, MUL_WEIGHT=weighted, W_SCALED=w_type != "*bf16"),
                                      aligned, num_warps=4, num_stages=2)
            for name, div, weighted, w_type in forms}


def _compile_int8() -> dict[str, dict[str, object]]:
    """compressed-tensors int8 W8A8's kernels: the per-token activation quantization (bf16 rows, K = 4096), the
    int32 product's scaling, and the fp8 GEMV's kernel over int8 codes at one row (FMA) and at 16 (`tl.dot`, codes
    converted to bf16)."""
    import triton.language as tl

    from flotilla.kernels.triton_fp8_quant import _quant_rows_kernel
    from flotilla.kernels.triton_gemv import _gemv_kernel

    quant = {"x_ptr": "*bf16", "out_ptr": "*i8", "scale_ptr": "*fp32", "static_scale_ptr": "*fp32"}
    int8_grid = dict(QMIN=-128.0, QMAX=127.0, ROUND_INT=True)
    pointers = {"x_ptr": "*bf16", "w_ptr": "*i8", "scale_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16",
                "part_ptr": "*fp32", "lora_part_ptr": "*fp32", "lora_b_ptr": "*bf16", "lora_slots_ptr": "*i32"}
    common = dict(HAS_SCALE=True, HAS_BIAS=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", LORA_SLICES=0,
                  LORA_BLOCK_R=16, LORA_BLOCK_S=2)  # fmt: skip
    fma = dict(common, SPLIT_K=1, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, NUM_STAGES=3)
    dot = dict(common, SPLIT_K=2, USE_DOT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4)
    from flotilla.kernels.triton_int8_scale import _scale_rows_kernel

    scale = {"acc_ptr": "*i32", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32", "bias_ptr": "*bf16",
             "out_ptr": "*bf16"}
    return {
        "int8_scale_rows": _compile_for_hopper(_scale_rows_kernel, scale, dict(HAS_BIAS=True, BLOCK_N=1024)),
        "int8_quant_rows": _compile_for_hopper(_quant_rows_kernel, quant, dict(
            STATIC=False, BLOCK_K=2048, **int8_grid)),
        "int8_quant_rows static": _compile_for_hopper(_quant_rows_kernel, quant, dict(
            STATIC=True, BLOCK_K=2048, **int8_grid)),
        "int8_gemv fma m1": _compile_for_hopper(_gemv_kernel, pointers, fma, num_warps=4, num_stages=3),
        "int8_gemv dot m16": _compile_for_hopper(_gemv_kernel, pointers, dot, num_warps=4, num_stages=4),
    }


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_int8_kernels_compile_for_hopper(compiled):
    """int8 W8A8's quantization and scaling kernels and the int8-code GEMV compile for sm_90 (this file run as a script
    with `int8`); the 16-row GEMV multiplies on the tensor cores, the one-row one with FMA."""
    result = compiled("int8")
    assert all(r["cubin_bytes"] > 0 for r in result.values())
    assert result["int8_gemv dot m16"]["mma"] and not result["int8_gemv fma m1"]["mma"]


@pytest.mark.skipif(_cuda_backend_missing(), reason="Triton's CUDA backend is not installed")
def test_fused_moe_compiles_for_hopper(compiled):
    """The fused MoE's grouped GEMM compiles for sm_90 (this file run as a script with `moe`), onto the tensor cores,
    for bf16 and fp8 experts; the fp8 forms convert the e4m3 weight tile in registers (no bf16 copy of the experts)."""
    result = compiled("moe")
    assert set(result) == {"fused_moe gate_up bf16", "fused_moe down bf16", "fused_moe gate_up fp8",
                           "fused_moe down fp8"}
    for name, r in result.items():
        assert r["cubin_bytes"] > 0 and r["mma"], name
        assert r["e4m3_cvt"] == name.endswith("fp8"), name


# The script's modes: one kernel family each, and `_compile_all` in two parts of about equal compile time (the
# fixture below runs them at once). Filled in here, where every function above is defined.
_ALL_PARTS = {"all-a": lambda: _compile_kv_writes() | _compile_fp8_gemv() | _compile_gemv_rope() | _compile_lora()
              | _compile_int4() | _compile_skinny_gemm() | _compile_pdl(),
              "all-b": _compile_paged_decode}  # fmt: skip
MODES = {"gated": _compile_gated_gemv, "rope": _compile_gemv_rope, "fp8row": _compile_fp8_row_gemv,
         "fp8block": _compile_fp8_block_linear,
         "prefill": _compile_prefill, "moe": _compile_fused_moe, "int8": _compile_int8, **_ALL_PARTS}  # fmt: skip


if __name__ == "__main__":
    # `gated` / `rope`: one fused batch-1 kernel alone (quick; e.g. under the H200's Triton 3.6 put first on
    # PYTHONPATH, bench/sass_loop.py's docstring)
    print(json.dumps(MODES.get(" ".join(sys.argv[1:]), _compile_all)()))

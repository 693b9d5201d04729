#!/usr/bin/env bash
# HISTORICAL: session 10's record, not a tool for today's tree. It ran at d188643 (branch audit10); its three
# gemv_rope cases were added and run (ONLY="qkv m1") on session 12's rope12, merged as 294c13f. The kernels moved on:
# `_gemv_rope_kernel`'s FP8 is FP8_CACHE since 16ee5ae (session 21), the decode kernel takes GROUP_P2 and MERGE_CHUNK
# (no defaults) since before 294c13f, and the engine's launches changed (tests/kernels/test_hopper_compile.py holds
# today's). bench/sass_loop.py now refuses a name a kernel lacks or a constexpr left without a value, so on today's
# tree those cases print an error where they used to compile another variant silently. To rerun it as it ran (PY: a
# venv with torch and Triton; the gemv_rope cases: 294c13f with ONLY="gemv_rope"):
#   git worktree add /tmp/audit10 d188643 && cd /tmp/audit10 && PY=.../.venv/bin/python bash bench/results/audit10-sass.sh
# The decode path's Triton kernels compiled for sm_90 on the CPU under Triton 3.6 (the H200's) and 3.9 (CI's), at
# the launch configurations the engine uses for Llama-3.1-8B (bench/sass_loop.py per kernel): main-loop length,
# registers, spills, 16-byte global loads. Prints one table, 3.6 against 3.9, a `!` where 3.6 is materially worse.
# The `row_acc` lines: the GEMV with a 2-D accumulator at one row (ROW_ACC), which exists only with
# bench/results/gpu-2026-12-04-s10/branch-notes/audit10-gemv-row-acc.diff applied (not merged: unmeasured); on main
# those lines report a compile error.
#   bash bench/results/audit10-sass.sh                      # downloads triton==3.6.0 into $T36 if missing
#   T36=/tmp/t36 PY=.venv/bin/python ONLY=gemv WORK=/tmp/a bash bench/results/audit10-sass.sh  # SASS in /tmp/a/sass
# Run from the repository root (a worktree: the flotilla package is mapped onto it through a shim on PYTHONPATH).
set -u
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}
T36=${T36:-/tmp/triton-3.6.0}
WORK=${WORK:-$(mktemp -d /tmp/audit10-sass.XXXX)}
export OMP_NUM_THREADS=1 TRITON_DEFAULT_FP_FUSION=1 PYTHONWARNINGS=ignore
if [ ! -d "$T36/triton" ]; then  # the H200's Triton, unpacked (sass_loop.py's docstring)
    mkdir -p "$T36" && "$PY" -m pip download -q triton==3.6.0 --no-deps -d "$T36/wheel" \
        && (cd "$T36" && "$PY" -m zipfile -e wheel/triton-3.6.0-*.whl .) && chmod +x "$T36"/triton/backends/nvidia/bin/*
fi
# a shim package so that `flotilla.*` imports this checkout (the venv's editable install may point elsewhere)
SHIM=$WORK/shim
mkdir -p "$SHIM/flotilla"
for f in "$ROOT"/flotilla/*.py; do ln -sf "$f" "$SHIM/flotilla/"; done
for d in engine kernels operator; do ln -sfn "$ROOT/$d" "$SHIM/flotilla/$d"; done

G="flotilla.kernels.triton_gemv:_gemv_kernel --ptr part_ptr=*fp32 --ptr lora_part_ptr=*fp32 --ptr lora_slots_ptr=*i64
   --ptr scale_ptr=*fp32 --int M=1 --const HAS_BIAS=False --const SPLIT_K=1 --const USE_DOT=False --const BLOCK_M=1
   --const BLOCK_K=512 --const DOT_DTYPE=tl.bfloat16 --const DOT_PRECISION=tf32 --int stride_xm=4096"
GB="$G --const HAS_SCALE=False --const NUM_STAGES=2 --stages 2"
GF="$G --ptr w_ptr=*fp8e4nv --const HAS_SCALE=True --const NUM_STAGES=3 --stages 3"
QKV="--int N=6144 --int K=4096 --int k_per_split=4096 --int stride_wn=4096 --const BLOCK_N=16"
OPROJ="--int N=4096 --int K=4096 --int k_per_split=4096 --int stride_wn=4096 --const BLOCK_N=8"
DOWN="--int N=4096 --int K=14336 --int k_per_split=14336 --int stride_wn=14336 --const BLOCK_N=8"
GATEUP="--int N=28672 --int K=4096 --int k_per_split=4096 --int stride_wn=4096 --const BLOCK_N=16"
SK="flotilla.kernels.triton_skinny_gemm:_skinny_gemm_kernel --ptr part_ptr=*fp32 --ptr counter_ptr=*i32 --int M=64
    --int splits=1 --const HAS_BIAS=False --const SPLIT=False --const DOT_DTYPE=tl.bfloat16 --const DOT_PRECISION=tf32
    --const BLOCK_M=64 --const EVEN=True"
SKT="flotilla.kernels.triton_skinny_gemm:_skinny_gemm_tma_kernel --ptr part_ptr=*fp32 --ptr counter_ptr=*i32
     --int M=64 --int splits=1 --const HAS_BIAS=False --const SPLIT=False --const DOT_DTYPE=tl.bfloat16
     --const DOT_PRECISION=tf32 --const BLOCK_M=64 --const GATED=False --int stride_om=0"
DEC="flotilla.kernels.triton_paged_decode:_decode_split_kernel --ptr block_tables_ptr=*i32
     --ptr query_start_loc_ptr=*i32 --ptr seq_lens_ptr=*i32 --ptr part_out_ptr=*fp32 --ptr part_lse_ptr=*fp32
     --ptr ticket_ptr=*i32 --ptr qk_scale=fp32 --ptr out_scale=fp32 --int stride_qt=4096 --int stride_qh=128
     --int stride_b=16384 --int stride_s=1024 --int stride_h=128 --int stride_bt=256 --int stride_ot=4096
     --int stride_oh=128 --int table_tokens=4096 --const NUM_HEADS=32 --const GROUP=4 --const GROUP_PAD=16
     --const HEAD_DIM=128 --const BLOCK_D=128 --const PAGE=16 --const DOT_PRECISION=tf32 --const K_LOAD_LAYOUT=False
     --const FUSED_MERGE=False"
DEC_BF16="$DEC --const DOT_DTYPE=tl.bfloat16 --const KV_FP8=0 --const BLOCK_N=64 --const KEY_STREAMS=0 --warps 4 --stages 2"
DEC_FP8="$DEC --ptr k_cache_ptr=*u8 --ptr v_cache_ptr=*u8 --const DOT_DTYPE=tl.float16 --const KV_FP8=5 --const BLOCK_N=32
         --const KEY_STREAMS=2 --warps 2 --stages 4"
MERGE="flotilla.kernels.triton_split_merge:split_merge_kernel --ptr part_out_ptr=*fp32 --ptr part_lse_ptr=*fp32
       --ptr query_start_loc_ptr=*i32 --int stride_ot=4096 --int stride_oh=128 --const NUM_HEADS=32 --const NUM_SPLITS=32
       --const SPLITS_PAD=32 --const HEAD_DIM=128 --const BLOCK_D=128 --const ROWS_ARE_SEQS=True --warps 4"
NORM="flotilla.kernels.triton_rmsnorm:_rms_norm_kernel --ptr eps=fp32 --int stride_x=4096 --int stride_r=4096
      --int stride_o=4096 --int stride_ro=4096 --int hidden=4096 --const HAS_RESIDUAL=True --const BLOCK=4096 --warps 8"
SILU="flotilla.kernels.triton_activation:_silu_and_mul_kernel --int stride_x=28672 --int stride_o=14336 --int d=14336
      --const BLOCK=1024 --warps 4"
ROT="flotilla.kernels.triton_rotary_kv_write:_rotary_kv_write_kernel --ptr positions_ptr=*i64
     --ptr slot_mapping_ptr=*i64 --ptr cos_sin_ptr=*fp32 --ptr inv_k_scale=fp32 --ptr inv_v_scale=fp32
     --int stride_qt=6144 --int stride_qh=128 --int stride_kt=6144 --int stride_kh=128 --int stride_vt=6144
     --int stride_vh=128 --int stride_qot=4096 --int stride_qoh=128 --int stride_cs=128 --int stride_kcb=16384
     --int stride_kcs=1024 --int stride_kch=128 --int stride_vcb=16384 --int stride_vcs=1024 --int stride_vch=128
     --int num_q_heads=32 --int num_kv_heads=8 --const Q_HEADS_PAD=32 --const K_HEADS_PAD=8 --const HALF=64
     --const HALF_PAD=64 --const PAGE=16 --warps 16"

# the qkv GEMV with rotary + KV write in its epilogue (kernels/triton_gemv_rope.py, rope12), as the dispatch launches it
ROPE="flotilla.kernels.triton_gemv_rope:_gemv_rope_kernel --ptr positions_ptr=*i64 --ptr slot_mapping_ptr=*i64
      --ptr cos_sin_ptr=*fp32 --ptr inv_k_scale=fp32 --ptr inv_v_scale=fp32 --int N=6144 --int K=4096
      --int stride_wn=4096 --int stride_cs=128 --int stride_kcb=16384 --int stride_kcs=1024 --int stride_kch=128
      --int stride_vcb=16384 --int stride_vcs=1024 --int stride_vch=128 --int num_q_heads=32 --int num_kv_heads=8
      --const HAS_BIAS=False --const HEAD_DIM=128 --const PAGE=16 --const FP8=False --const BLOCK_N=16
      --const BLOCK_K=512 --const NUM_STAGES=2 --stages 2 --warps 4"
CASES=(
  "gemv bf16 qkv m1|$GB $QKV"
  "gemv bf16 qkv m1 pdl|$GB $QKV --const PDL=True"
  "gemv bf16 o_proj m1|$GB $OPROJ"
  "gemv bf16 o_proj m1 pdl|$GB $OPROJ --const PDL=True"
  "gemv bf16 down m1|$GB $DOWN"
  "gemv bf16 down m1 pdl|$GB $DOWN --const PDL=True"
  "gemv fp8 qkv m1|$GF $QKV"
  "gemv fp8 o_proj m1|$GF $OPROJ"
  "gemv fp8 gate_up m1|$GF $GATEUP"
  "gemv fp8 down m1|$GF $DOWN"
  "gemv fp8 qkv m1 pdl (off by default)|$GF $QKV --const PDL=True"
  "gemv bf16 qkv m1 row_acc|$GB $QKV --const ROW_ACC=True"
  "gemv bf16 o_proj m1 pdl row_acc|$GB $OPROJ --const PDL=True --const ROW_ACC=True"
  "gemv fp8 qkv m1 row_acc|$GF $QKV --const ROW_ACC=True"
  "gemv fp8 down m1 row_acc|$GF $DOWN --const ROW_ACC=True"
  "skinny qkv m64 bn64 bk128 s5|$SK --int N=6144 --int K=4096 --int k_per_split=4096 --int stride_xm=4096 --int stride_wn=4096 --int stride_om=6144 --const BLOCK_N=64 --const BLOCK_K=128 --const GATED=False --warps 4 --stages 5"
  "skinny gate_up+silu m64 bn128 bk64 s5|$SK --int N=14336 --int K=4096 --int k_per_split=4096 --int stride_xm=4096 --int stride_wn=4096 --int stride_om=14336 --const BLOCK_N=128 --const BLOCK_K=64 --const GATED=True --warps 8 --stages 5"
  "skinny tma o_proj m64 bn64 bk128 s6|$SKT --ptr x_desc=tensordesc<bf16[64,128]> --ptr w_desc=tensordesc<bf16[64,128]> --int N=4096 --int K=4096 --int k_per_split=4096 --const BLOCK_N=64 --const BLOCK_K=128 --warps 4 --stages 6"
  "skinny tma down m64 bn64 bk128 s6|$SKT --ptr x_desc=tensordesc<bf16[64,128]> --ptr w_desc=tensordesc<bf16[64,128]> --int N=4096 --int K=14336 --int k_per_split=14336 --const BLOCK_N=64 --const BLOCK_K=128 --warps 4 --stages 6"
  "skinny tma lm_head m64 bn256 bk64 s5|$SKT --ptr x_desc=tensordesc<bf16[64,64]> --ptr w_desc=tensordesc<bf16[256,64]> --int N=128256 --int K=4096 --int k_per_split=4096 --const BLOCK_N=256 --const BLOCK_K=64 --warps 4 --stages 5"
  "decode bf16 pool 64/4/2 bs64 (1 split)|$DEC_BF16 --int split_len=4096 --const NUM_SPLITS=1 --const SPLITS_PAD=1"
  "decode bf16 pool 64/4/2 bs1 (32 splits)|$DEC_BF16 --int split_len=128 --const NUM_SPLITS=32 --const SPLITS_PAD=32"
  "decode fp8 pool 32/2/4 cvtpx 2 streams bs64|$DEC_FP8 --int split_len=4096 --const NUM_SPLITS=1 --const SPLITS_PAD=1"
  "decode fp8 pool 32/2/4 cvtpx 2 streams bs1|$DEC_FP8 --int split_len=128 --const NUM_SPLITS=32 --const SPLITS_PAD=32"
  "split_merge 32 splits|$MERGE"
  "split_merge 32 splits pdl|$MERGE --const PDL=True"
  "rms_norm residual 4096 w8|$NORM"
  "rms_norm residual 4096 w8 pdl|$NORM --const PDL=True"
  "silu_and_mul 14336 b1024 w4|$SILU"
  "silu_and_mul 14336 b1024 w4 pdl|$SILU --const PDL=True"
  "rotary_kv_write bf16 w16|$ROT --const FP8=False"
  "rotary_kv_write bf16 w16 pdl|$ROT --const FP8=False --const PDL=True"
  "rotary_kv_write fp8 w16|$ROT --ptr k_cache_ptr=*fp8e4nv --ptr v_cache_ptr=*fp8e4nv --const FP8=True"
  "gemv_rope bf16 qkv m1|$ROPE"
  "gemv_rope bf16 qkv m1 pdl|$ROPE --const PDL=True"
  "gemv_rope bf16 qkv m1 bias fp8 cache|$ROPE --ptr k_cache_ptr=*fp8e4nv --ptr v_cache_ptr=*fp8e4nv --const FP8=True --const HAS_BIAS=True"
)
OUTF=$WORK/sass.jsonl
: > "$OUTF"
mkdir -p "$WORK/sass"
i=0
for case in "${CASES[@]}"; do
    i=$((i + 1))
    name=${case%%|*}
    args=${case#*|}
    case "$name" in *"${ONLY:-}"*) ;; *) continue ;; esac
    for ver in 3.9 3.6; do
        pp=$SHIM
        [ "$ver" = 3.6 ] && pp=$T36:$SHIM
        # shellcheck disable=SC2086  # the argument strings are word lists
        line=$(PYTHONPATH=$pp timeout 600 "$PY" "$ROOT/bench/sass_loop.py" $args --dump "$WORK/sass/$i-$ver.sass" 2>"$WORK/err" | tail -1)
        [ -n "$line" ] || line="{\"error\": \"$(tail -1 "$WORK/err" | tr -d '"\\')\"}"
        echo "{\"case\": \"$name\", \"want\": \"$ver\", \"r\": $line}" >> "$OUTF"
    done
done
"$PY" - "$OUTF" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["case"], {})[r["want"]] = r["r"]
print(f"{'kernel @ launch':48} {'loop 3.9':>8} {'loop 3.6':>8} {'tot 3.9':>7} {'tot 3.6':>7} {'regs':>9} {'stack':>7}"
      f" {'LDG*.128':>9} {'PTX v4':>9}  flag")
for case, v in by.items():
    a, b = v.get("3.9", {}), v.get("3.6", {})
    if "error" in a or "error" in b:
        print(f"{case:48} error: {a.get('error') or b.get('error')}")
        continue
    flags = []
    base = a["loop_len"] if a["loop_len"] > 1 else a["total"]  # no loop: the trailing `BRA` to itself
    new = b["loop_len"] if b["loop_len"] > 1 else b["total"]
    if new > 1.15 * base:
        flags.append(f"+{100 * (new / base - 1):.0f}% instructions")
    if (b["stack"] or 0) > (a["stack"] or 0):
        flags.append("spills")
    if b["ldg_128"] < a["ldg_128"] or b["ptx_16_byte_loads"] < a["ptx_16_byte_loads"]:
        flags.append("lost 16-byte loads")
    pair = lambda k: f"{a[k]}/{b[k]}"
    print(f"{case:48} {a['loop_len']:>8} {b['loop_len']:>8} {a['total']:>7} {b['total']:>7} {pair('regs'):>9}"
          f" {pair('stack'):>7} {pair('ldg_128'):>9} {pair('ptx_16_byte_loads'):>9}  {'! ' + ', '.join(flags) if flags else ''}")
print(f"(pairs are 3.9/3.6; loop = the main loop's SASS instructions, tot = the whole kernel's; raw: {sys.argv[1]})")
PYEOF

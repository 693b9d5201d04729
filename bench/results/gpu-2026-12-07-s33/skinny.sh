#!/bin/bash
# Session 33 (helper skinny33): issue 19's cached-prefix TTFT (>= 10x below uncached; H200 s23: 49.06 / 5.74 ms =
# 8.55x, the cached request's GPU time mostly the skinny GEMM at 32 rows: 3,830 of 4,929 us) -- the skinny GEMM's
# 32-row tiles chosen INSIDE the engine, as the one-row GEMVs' were (sessions 25, 29), on one H100 or H200. From the
# repository root, carrying .whl (the pydantic stack, as every bench/results script):
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s33/skinny.sh
# Without a GPU, before spending device time (bash -n; py_compile; every first-round candidate launched under the
# Triton interpreter against skinny_gemm_ref at small shapes, the adopt spec parsed back, config and summary on made-up
# JSON; every first-round candidate compiled for sm_90 within shared memory; the descent's --dry-run; ~2 min on a
# loaded CPU):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s33/skinny.sh
# Stages (BUDGET_S, default 520 s; each under its own limit, capped by what is left):
#   sweep (300 s) bench/tile_sweep.py --family skinny32: one engine (Llama-3.1-8B shape, random bf16, prefix caching
#         on), a 20-token extend over a 2,000-token cached prefix recorded once; coordinate descent over o, qkv, down,
#         gate_up (each candidate: that shape's table entry set in-process, the one-sequence 32-row mixed graph captured
#         again, 40 replays timed by CUDA events, the median; `cublas` one of the candidates); then orig new new orig
#         (100 replays each) and a cached-prefix request's greedy tokens under both. -> sweep.json
#   ttft  (2 x 75 s) bench/prefix.py as prefix7-gpu.sh's `on` run (2,000 cached + 20 new tokens, 5 pairs, the cached
#         request profiled): old = the committed table; new = the sweep's (FLOTILLA_SKINNY_GEMM_CONFIGS, the card's whole
#         table with the descent's 32-row entries), skipped when the descent changed nothing. -> ttft-old.json,
#         ttft-new.json
#   summary (always) skinny_pick.py summary: SUMMARY lines (A/B, each shape's pick, TTFT old/new and the ratio, the
#         verdict and, if ADOPT, the MEASURED_CONFIGS line for the card) on top of skinny.log
# $OUT (5 files): skinny.log (read first), sweep.json, ttft-old.json, ttft-new.json, sides.tgz (every stage's output).
# SKINNY_CONFIGS="<FLOTILLA_SKINNY_GEMM_CONFIGS spec>" with STAGES="ttft summary" times a given table without the sweep.
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s33
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/skinny.sh bench/results/gpu-env.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/tile_sweep.py bench/tile_families.py bench/tile_descent.py bench/extend_graph.py \
    bench/prefix.py bench/model_dirs.py $HERE_REL/skinny_pick.py && echo "py_compile: ok" || exit 1
  D=/tmp/skinny33-dry; mkdir -p $D/p/flotilla && cp flotilla/*.py $D/p/flotilla/ \
    && ln -sfn "$PWD/engine" $D/p/flotilla/engine && ln -sfn "$PWD/kernels" $D/p/flotilla/kernels || exit 1
  TMPDIR=$D TRITON_INTERPRET=1 PYTHONPATH=$D/p:$PWD/bench $PY $HERE_REL/skinny_pick.py selftest || exit 1
  TRITON_CACHE_DIR=$D/triton TRITON_INTERPRET= PYTHONPATH=$D/p:$PWD/bench $PY $HERE_REL/skinny_pick.py hopper || exit 1
  PYTHONPATH=$D/p:$PWD/bench $PY bench/tile_sweep.py --family skinny32 --dry-run | grep -E "^SWEEP (dry|o|qkv)" \
    && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/skinny33w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-520}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 520
export OMP_NUM_THREADS=1
L=$O/skinny.log; : > $L
PICK="python3 $R/$HERE_REL/skinny_pick.py"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
PREFIX_ARGS="--shape llama-3.1-8b --load-format dummy --skip-batch --single-engine --prefix-len 2000 --suffix-len 20
  --output-len 16 --repeats 5 --max-num-batched-tokens 8192 --profile-kernels"
ttft() {  # ttft NAME [SPEC]: prefix7-gpu.sh's `on` run (every lever on), the table from SPEC or the committed one
  run_stage ttft-$1 75 "Error|captured|runs eagerly" env FLOTILLA_PREFILL_TILE_MEMO=1 FLOTILLA_ONE_SEQ_GRAPHS=1 \
    FLOTILLA_EXTEND_ATTN= FLOTILLA_SKINNY_GEMM_CONFIGS="${2:-}" python3 $R/bench/prefix.py $PREFIX_ARGS \
    --json $W/ttft-$1.json
  cp $W/ttft-$1.json $O/ 2>/dev/null
}
for s in ${STAGES:-sweep ttft summary}; do
  case $s in
    sweep) python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      lim=$(left 300)
      run_stage sweep $lim "^startup|^timed|^warm|^SWEEP|  ab |phase failed" python3 $R/bench/tile_sweep.py \
        --family skinny32 --model /tmp/llama8b --json $W/sweep.json --budget-s $((lim - 10)) --reserve-s 30 \
        --steps 40 --ab-steps 100 --candidates 14 --margin-us 5 ${SWEEP_ARGS:-}
      cp $W/sweep.json $O/ 2>/dev/null ;;
    ttft) spec=${SKINNY_CONFIGS:-$($PICK config $W/sweep.json)}
      ttft old
      if [ -n "$spec" ]; then
        echo "ttft new: FLOTILLA_SKINNY_GEMM_CONFIGS=$spec" | tee -a $L
        ttft new "$spec"
      else
        echo "=== ttft-new: skipped (the sweep kept the committed table, or gave none)" | tee -a $L
      fi ;;
    summary) $PICK summary $W > $W/summary.txt 2>&1
      cat $W/summary.txt $L > $W/skinny.log && cp $W/skinny.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

#!/bin/bash
# Session 30 (helper kv30): issue 22's fp8-KV floor on one H100 or H200 (written for the H200, where it is missed:
# s29 9.07 / 12.42 ms = 0.730x, floor 0.70x), then the int4 one-row tile descent if time is left. From the repository
# root, carrying .whl (the pydantic stack, as every bench/results script):
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s30/next.sh
# Without a GPU, before spending device time (bash -n of this and the scripts it calls; the sweep's rows and their
# engine specs through the parsers the engine uses; pick and summary on made-up JSON; every candidate launch under the
# Triton interpreter against the PyTorch reference; ~2 min on a loaded CPU):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s30/next.sh
# Stages (BUDGET_S, default 520 s of the call's 540; each under its own limit, capped by what is left):
#   sweep  (60 s) bench/fp8_kv_decode.py --batches 64 --grid kv30 --workers 8: the attention kernel at 64 x 4,096,
#          bf16 pool, the fp8 default (lean h2 64/4/3, 8 warps an SM), KV30_GRID (more warps an SM for the same bytes
#          in flight: h2 64/8/3, h1 64/4/3, 64/2/3, 32/2/4, 32/2/3, h2 64/8/3 masked), the default again (drift), the
#          default and h2 64/8/3 on a table of consecutive pages. -> sweep.json
#   step   (150 s) bench/quant_gpu.py --kv-cache-dtype fp8 --jobs bs64ab --relaunch "B1;B2": one engine, the default
#          launch (A) against the sweep's (up to) two lean rows >= 1 % faster than the default's kernel (else the
#          fastest other row), same 64 requests of 4,096 tokens, A B1 B2 B2 B1 A, 32 timed steps a phase. -> step.json
#   tests  (40 s) the GPU test of the kv30 launches (reference, CUDA-graph replay) at Llama heads.
#   bf16   (100 s; skipped under 110 s left) bench/quant_gpu.py --jobs bs64, the bf16-KV step of this call: the
#          ratio's denominator (else session 29's 12.42 ms). -> bf16.json
#   int4   (the rest, if >= 150 s) bench/results/tile20-gpu.sh STAGES="sweep summary": the wide int4 GEMV's tiles by
#          in-engine coordinate descent from the card's table (the H200's o_proj 8 x 256 since s25), orig/new A/B.
#          -> int4-tile20.log, int4-tile20.json
#   summary (always) `SUMMARY ... adopt:` lines (kv30_pick.py summary; tile20's own SUMMARY lines) on top of next.log
# $OUT (at most 8 files): next.log (read first: summary, then every stage's log lines), sweep.json, step.json,
# bf16.json, int4-tile20.log, int4-tile20.json, sides.tgz (every stage's whole output).
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s30
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/next.sh bench/results/gpu-env.sh bench/results/tile20-gpu.sh bench/results/bf16-stages.sh \
           bench/results/w4a16-model.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/fp8_kv_decode.py bench/quant_gpu.py bench/int4_tile_sweep.py $HERE_REL/kv30_pick.py || exit 1
  mkdir -p /tmp/kv30-dry/p/flotilla && cp flotilla/*.py /tmp/kv30-dry/p/flotilla/ \
    && ln -sfn "$PWD/engine" /tmp/kv30-dry/p/flotilla/engine && ln -sfn "$PWD/kernels" /tmp/kv30-dry/p/flotilla/kernels
  TMPDIR=/tmp/kv30-dry TRITON_INTERPRET=1 PYTHONPATH=/tmp/kv30-dry/p:$PWD/bench $PY $HERE_REL/kv30_pick.py selftest \
    && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/kv30w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-520}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 520
export OMP_NUM_THREADS=1
L=$O/next.log; : > $L
PICK="python3 $R/$HERE_REL/kv30_pick.py"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
for s in ${STAGES:-sweep step tests bf16 int4 summary}; do
  case $s in
    sweep) run_stage sweep 60 "^  |^b64|compiled" python3 $R/bench/fp8_kv_decode.py --json $W/sweep.json \
        --batches 64 --grid kv30 --workers 8
      cp $W/sweep.json $O/ 2>/dev/null ;;
    step) specs=${KV30_SPECS:-$($PICK pick $W/sweep.json)}
      echo "step: B = $specs" | tee -a $L
      python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      run_stage step 150 "quant_gpu|bs64ab" env -u FLOTILLA_DECODE_FP8_LAUNCH -u FLOTILLA_DECODE_WAVE \
        -u FLOTILLA_DECODE_FP8_LEAN python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name fp8kv-kv30 \
        --kv-cache-dtype fp8 --jobs bs64ab --relaunch "$specs" --json $W/step.json
      cp $W/step.json $O/ 2>/dev/null ;;
    tests) run_stage tests 40 "passed|failed|FAILED|error" python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml \
        --rootdir=$R -q -rs --basetemp=/tmp/pt -m gpu $R/tests/kernels/test_fp8_kv_cache.py -k kv30_launches ;;
    bf16) [ $((END - SECONDS)) -lt 110 ] && { echo "=== bf16: skipped ($((END - SECONDS)) s left)" | tee -a $L; continue; }
      python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      run_stage bf16 100 "quant_gpu|bs64|KV cache" python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name bf16 \
        --jobs bs64 --json $W/bf16.json
      cp $W/bf16.json $O/ 2>/dev/null ;;
    int4) left_s=$((END - SECONDS - 15))
      [ $left_s -lt 150 ] && { echo "=== int4: skipped ($left_s s left)" | tee -a $L; continue; }
      echo "=== int4 $(date +%T) ($left_s s for tile20-gpu.sh)" | tee -a $L
      mkdir -p $W/int4
      (cd $R && OUT=$W/int4 BUDGET_S=$left_s STAGES="sweep summary" timeout $((left_s + 10)) \
        bash bench/results/tile20-gpu.sh > $W/int4.out 2>&1)
      echo "rc=$?" | tee -a $L
      grep -E "^SUMMARY|Traceback|Error" $W/int4/tile20.log 2>/dev/null | cut -c1-600 | tee -a $L
      cp $W/int4/tile20.log $O/int4-tile20.log 2>/dev/null; cp $W/int4/tile20.json $O/int4-tile20.json 2>/dev/null ;;
    summary) { $PICK summary $W 2>&1; grep -E "^SUMMARY" $W/int4/tile20.log 2>/dev/null | sed 's/^SUMMARY /SUMMARY int4 /'; \
        grep -E "^SUMMARY FLOTILLA_INT4" $W/int4/tile20.log 2>/dev/null \
        | sed 's/^SUMMARY /SUMMARY int4 adopt (the H200 entry of triton_int4_gemv_wide.MEASURED_TILES, if new < orig): /'; \
        } > $W/summary.txt
      cat $W/summary.txt $L > $W/next.log && cp $W/next.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz --exclude=int4/tile20.json *.out int4 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

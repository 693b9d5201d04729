#!/bin/bash
# Issue 22's int4 floor on the H200, one call (BUDGET_S, default 200 s of device time): W4A16 (compressed-tensors
# pack-quantized, group 128, symmetric, random int4 codes via --load-format dummy), Llama-3.1-8B shape, decode at
# batch 1 / context 512 <= 0.45x the bf16 step of the same call. Stages, each under its own limit (capped by what is
# left of BUDGET_S; the JSON files are written as results come, so a cut stage still leaves what it measured):
#   gemv   (65 s) bench/int4_gemv.py: the int4 paths alone (W4A16 GEMV, tl.dot GEMM, dequantize + cuBLAS) vs bf16
#          cuBLAS at the four projections, M = 1, 4, 16, 64, and the GEMV over a tile grid at M = 1; each projection's
#          winner (the "GRID m1" line) is passed to the int4 stage as FLOTILLA_INT4_GEMV_TILES
#   int4   (85 s) bench/quant_gpu.py, the W4A16 engine: start-up phases with timestamps in int4g-int4.log (model
#          build, quantized layers, dummy fill, memory profile, each graph captured), then the bs1 step; the JSON's
#          int4_paths lists which int4 path saw which row counts (GEMV <= 16 rows, GEMM <= 256, dequantize above)
#   bf16   (40 s) the same engine with bf16 weights (the baseline, 4.63 ms in session 5)
#   tests  (20 s, what is left) the int4 kernel tests compiled on the GPU (GEMV, GEMM, dequantization, the dispatch's paths)
#   summary       int4 / bf16 step ratio against the 0.45 target -> $OUT/int4g-summary.json (always runs)
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=200 bash bench/results/int4g-gpu.sh
# STAGES="int4 bf16 summary" runs a subset.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/int4g.log
source $R/bench/results/w4a16-model.sh  # by $R: gpu-env.sh has changed to /tmp
TILES=""
for s in ${STAGES:-gemv int4 bf16 tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    gemv) timeout $(left 65) python3 $R/bench/int4_gemv.py --rows 1,4,16,64 --grid --grid-rows 1 \
            --json $OUT/int4g-gemv.json > $OUT/int4g-gemv.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^copy|^INT4|^GRID|Error|error" $OUT/int4g-gemv.log | cut -c1-400 | tee -a $L
      # each projection's grid winner as FLOTILLA_INT4_GEMV_TILES ("NxK:use_dot=..,block_n=..,...;...")
      TILES=$(python3 - $OUT/int4g-gemv.json <<'PY'
import json, sys
try:
    print(json.load(open(sys.argv[1]))["grid"][0]["env"])
except (OSError, ValueError, KeyError, IndexError):
    print("")
PY
)
      echo "one-row GEMV tiles for the int4 stage: ${TILES:-default}" | tee -a $L ;;
    int4|bf16)
      if [ $s = int4 ]; then lim=85 model=/tmp/llama8b-w4a16 extra="--weights int4"; else lim=40 model=/tmp/llama8b extra=""; fi
      env FLOTILLA_INT4_GEMV_TILES="$TILES" timeout $(left $lim) python3 $R/bench/quant_gpu.py --model $model --name $s \
        $extra --jobs bs1 --max-num-seqs 16 --json $OUT/int4g-$s.json > $OUT/int4g-$s.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "quant_gpu|model_loader|model loaded|memory profile|cuda_graphs|KV cache:|Error|error" \
        $OUT/int4g-$s.log | cut -c1-300 | tail -12 | tee -a $L
      [ -s $OUT/int4g-$s.json ] && python3 -c "
import json, sys; r = json.load(open(sys.argv[1])); b = r.get('bs1', {})
print(r['name'], 'startup %.1f s' % r['startup_s'], 'bs1 %s ms/step (roofline %s, graphed %s/%s)' % (
    b.get('ms_per_step'), b.get('roofline_ms'), b.get('graphed_steps'), b.get('steps')), r.get('int4_paths', ''))
" $OUT/int4g-$s.json 2>&1 | tee -a $L ;;
    tests) timeout $(left 20) python3 -m pytest $R/tests/kernels/test_int4_gemv.py $R/tests/kernels/test_int4_gemm.py -q \
             -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R > $OUT/int4g-tests.log 2>&1
      grep -E "Error|error:|passed|failed" $OUT/int4g-tests.log | tail -8 | tee -a $L ;;
    summary) TILES_USED="$TILES" python3 - <<'PY' 2>&1 | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
runs = {}
for name in ("int4", "bf16"):
    try:
        runs[name] = json.load(open(f"{out}/int4g-{name}.json"))
    except (OSError, ValueError) as e:
        runs[name] = {"error": str(e)}
try:
    ratio = runs["int4"]["bs1"]["ms_per_step"] / runs["bf16"]["bs1"]["ms_per_step"]
except (KeyError, TypeError, ZeroDivisionError):
    ratio = None
summary = {"runs": runs, "step_bs1_int4_over_bf16": ratio, "target": "<= 0.45",
           "tiles": os.environ.get("TILES_USED", "")}
json.dump(summary, open(f"{out}/int4g-summary.json", "w"), indent=1)
for name, r in runs.items():
    print(name, r.get("error") or f"bs1 {r.get('bs1', {}).get('ms_per_step')} ms, startup {r.get('startup_s', 0):.1f} s")
print(f"int4 / bf16 decode bs1 ctx512: {'n/a' if ratio is None else f'{ratio:.3f}'} (target <= 0.45)")
PY
      ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 220
# Issue 22 on the H200, one call (BUDGET_S, default 220 s of device time): the wide int4 W4A16 GEMV
# (kernels/triton_int4_gemv_wide.py: 16-byte weight loads, FMA, 1-4 rows) per projection and in the engine's
# decode step at batch 1, context 512 (Llama-3.1-8B shape, compressed-tensors pack-quantized, group 128,
# symmetric, random int4 codes via --load-format dummy), against the bf16 step (target int4 <= 0.45x bf16).
# Stages, each under its own limit (capped by what is left of BUDGET_S):
#   gemv   (60 s) bench/int4_gemv.py at 1 row: the wide GEMV's default launch and a tile grid (compiled first by
#          12 processes) vs the old default int4 GEMV (tensor-core path) and bf16 cuBLAS, per projection
#          (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336): "WIDE" lines (us, GB/s of int4
#          bytes), then "WIDE_GRID" (layer totals; each projection's best tile as FLOTILLA_INT4_GEMV_WIDE_CONFIG,
#          passed to the new stage)
#   tests  (25 s) the GPU-marked wide GEMV tests (PTX vs plain nibble path bit-equal, Llama shapes 1 and 4 rows
#          symmetric/asymmetric against the reference, the dispatch switch)
#   new    (75 s) bench/quant_gpu.py, the W4A16 engine with FLOTILLA_INT4_GEMV_WIDE=1 (+ the grid's tiles): bs1
#          ms/step, 32 greedy tokens, which int4 path saw which rows
#   bf16   (45 s) the same engine with bf16 weights (the baseline)
#   old    (60 s, only if 60 s are left) the W4A16 engine on main's int4 path (FLOTILLA_INT4_GEMV_WIDE unset)
#   summary       new / bf16 (and old / bf16) bs1 ratio against 0.45, greedy tokens new vs old -> always runs
# Files in $OUT (4): qgemv10.log (read first), qgemv10-detail.log (every stage's full output),
# qgemv10-gemv.json, qgemv10-summary.json (the engine runs' JSON inside).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=220 bash bench/results/qgemv10-gpu.sh
# STAGES="new bf16 summary" runs a subset; WIDE_CONFIG="..." gives the new stage tiles without the gemv stage.
L=$OUT/qgemv10.log
D=$OUT/qgemv10-detail.log
source $R/bench/results/w4a16-model.sh  # by $R: gpu-env.sh has changed to /tmp
WIDE_CFG=${WIDE_CONFIG:-}
rm -f /tmp/qgemv10-*.json  # a warm machine's earlier run must not stand in for a skipped stage
engine() {  # name limit model extra-args... (the env set by the caller)
  local name=$1 lim; lim=$(left $2); shift 2
  echo "--- $name $(date +%T) limit $lim s" >> $D
  timeout $lim python3 $R/bench/quant_gpu.py --name $name --jobs bs1,greedy --max-num-seqs 16 \
    --json /tmp/qgemv10-$name.json "$@" >> $D 2>&1
  echo "rc=$?" | tee -a $L
  [ -s /tmp/qgemv10-$name.json ] && python3 -c "
import json, sys; r = json.load(open(sys.argv[1])); b = r.get('bs1', {})
print(r['name'], 'startup %.1f s' % r['startup_s'], 'bs1 %s ms/step (roofline %s, graphed %s/%s)' % (
    b.get('ms_per_step'), b.get('roofline_ms'), b.get('graphed_steps'), b.get('steps')), r.get('int4_paths', ''),
    'greedy', r.get('greedy', [])[:8])
" /tmp/qgemv10-$name.json 2>&1 | tee -a $L
}
for s in ${STAGES:-gemv tests new bf16 old summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  [ $s = old ] && [ $((END - SECONDS)) -lt 60 ] && { echo "skipped: under 60 s left" | tee -a $L; continue; }
  case $s in
    gemv) echo "--- gemv $(date +%T)" >> $D
      timeout $(left 60) python3 $R/bench/int4_gemv.py --rows 1 --paths int4_gemv,int4_gemv_wide,bf16_cublas --wide \
        --grid-rows 1 --warm-jobs 12 --json $OUT/qgemv10-gemv.json >> $D 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^copy|^warm|^INT4|^WIDE|^  |Error|error" $D | cut -c1-330 | tee -a $L
      # each projection's best tile, where it is not the default launch ("NxK:block_n=..,...;...")
      WIDE_CFG=$(python3 - $OUT/qgemv10-gemv.json <<'PY'
import json, sys
try:
    print(json.load(open(sys.argv[1]))["wide"][0]["env"])
except (OSError, ValueError, KeyError, IndexError):
    print("")
PY
)
      echo "wide GEMV tiles for the new stage: ${WIDE_CFG:-default}" | tee -a $L ;;
    tests) echo "--- tests $(date +%T)" >> $D
      timeout $(left 25) python3 -m pytest $R/tests/kernels/test_int4_gemv_wide.py -m gpu -q -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R > /tmp/qgemv10-tests.log 2>&1
      cat /tmp/qgemv10-tests.log >> $D
      grep -E "Error|error:|passed|failed" /tmp/qgemv10-tests.log | tail -8 | tee -a $L ;;
    new) FLOTILLA_INT4_GEMV_WIDE=1 FLOTILLA_INT4_GEMV_WIDE_CONFIG="$WIDE_CFG" \
           engine new 75 --model /tmp/llama8b-w4a16 --weights int4 ;;
    bf16) engine bf16 45 --model /tmp/llama8b ;;
    old) engine old 60 --model /tmp/llama8b-w4a16 --weights int4 ;;
    summary) WIDE_USED="$WIDE_CFG" python3 - <<'PY' 2>&1 | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
runs = {}
for name in ("new", "bf16", "old"):
    try:
        runs[name] = json.load(open(f"/tmp/qgemv10-{name}.json"))
    except (OSError, ValueError) as e:
        runs[name] = {"error": str(e)}


def step(name):
    return runs[name].get("bs1", {}).get("ms_per_step")


ratios = {}
for name in ("new", "old"):
    if step(name) and step("bf16"):
        ratios[f"{name}_over_bf16"] = step(name) / step("bf16")
toks = {name: runs[name].get("greedy") for name in runs}
same = None
if toks.get("new") and toks.get("old"):
    same = next((i for i, (a, b) in enumerate(zip(toks["new"], toks["old"])) if a != b), len(toks["new"]))
summary = {"runs": runs, "ratios": ratios, "target": "new_over_bf16 <= 0.45", "wide_config": os.environ.get("WIDE_USED", ""),
           "greedy_common_prefix_new_old": same, "greedy_len": len(toks.get("new") or [])}
json.dump(summary, open(f"{out}/qgemv10-summary.json", "w"), indent=1)
for name, r in runs.items():
    print(name, r.get("error") or f"bs1 {step(name)} ms, startup {r.get('startup_s', 0):.1f} s, paths {r.get('int4_paths', '')}")
for key, v in ratios.items():
    print(f"int4 {key.split('_')[0]} / bf16 decode bs1 ctx512: {v:.3f} (target <= 0.45)")
if same is not None:
    print(f"greedy tokens new vs old: {'EQUAL' if same == len(toks['new']) else f'first {same} equal of'} "
          f"{len(toks['new'])}")
elif toks.get("new") and toks.get("bf16"):
    print("greedy tokens: no old run to compare (bf16's differ by construction: other weights)")
PY
      ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

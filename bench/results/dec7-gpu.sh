#!/bin/bash
# Issue 19's batch-64 decode floor (<= 5.41 ms at ctx 512, Llama-3.1-8B shape, bf16) on the H200, one call
# (BUDGET_S, default 150 s): the Triton skinny GEMM (kernels/triton_skinny_gemm.py) against cuBLAS, first per
# projection, then in the engine's decode step. Stages, each under its own limit (capped by what is left):
#   sweep   (55 s) bench/skinny_gemm.py: qkv / o / gate_up (+ its gated SiLU epilogue) / down / LM head at
#          M = 1, 24, 32, 64, 128: F.linear vs the skinny GEMM's default and, at M = 64, a grid of tiles x
#          stages x warps x K splits x pointer/TMA loads (the 4 best per shape also at the other
#          M; at M = 1 a small grid on qkv / o / down against the engine's GEMV too); compiled first over
#          14 processes. BEST lines per shape and M; the CONFIGS line (each shape's winner where it beat
#          cuBLAS) goes to the `on` side as FLOTILLA_SKINNY_GEMM_CONFIGS
#   off    (45 s: a cold Triton cache compiles the engine's kernels) bench/decode_ab.py, FLOTILLA_SKINNY_GEMM=0
#          (main's path, cuBLAS): greedy tokens of 64 prompts
#          decoded together, ms/step at batch 1 and 64 (ctx 512, graphed), per-kernel profile at batch 64
#   on     (45 s) the same with the skinny GEMM where its table says (FLOTILLA_SKINNY_GEMM=table, the default):
#          the sweep's configs when the sweep ran in this call (it compiled every variant the engine's graphs,
#          M 24, 32, 48/64, 128, take into Triton's cache), else the measured table in the kernel module
#   tests  (10 s, only if 15 s are left) tests/kernels/test_skinny_gemm.py compiled on the GPU
#   summary      ms/step off vs on against the 5.41 / 4.05 ms floors, tokens equal, profile groups -> dec7.log
# At most 8 files in $OUT: dec7.log (read first), dec7-sweep.{log,json}, dec7-{off,on}.json, dec7-sides.log,
# dec7-tests.log, dec7-summary.json.
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=150 bash bench/results/dec7-gpu.sh
# STAGES="off on summary" runs a subset (the `on` side then takes the measured table; ~95 s); CTX=4096 sets
# the sides' context; SIDE_S each side's limit (default 45 s; ctx 4,096 starts in ~50 s).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/dec7.log
CONFIGS=""
side() {  # label limit FLOTILLA_SKINNY_GEMM
  local lim; lim=$(left $2)
  echo "--- $1 $(date +%T) limit $lim s" >> $OUT/dec7-sides.log
  env FLOTILLA_SKINNY_GEMM=$3 FLOTILLA_SKINNY_GEMM_CONFIGS="$CONFIGS" timeout $lim python3 $R/bench/decode_ab.py \
    --label $1 --batch-sizes 1,64 --profile-batch-sizes 64 --token-batch 64 --context ${CTX:-512} --json $OUT/dec7-$1.json \
    >> $OUT/dec7-sides.log 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "^$1:|Error|error" $OUT/dec7-sides.log | grep -v "^--- " | tail -5 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-sweep off on tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    sweep) timeout $(left 55) python3 $R/bench/skinny_gemm.py --rows 1,24,32,64,128 --grid-rows 64 --workers 14 \
             --json $OUT/dec7-sweep.json > $OUT/dec7-sweep.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^BEST|^CONFIGS|Error|error" $OUT/dec7-sweep.log | cut -c1-330 | tail -40 | tee -a $L
      CONFIGS=$(python3 -c "
import json, sys
try:
    print(json.load(open(sys.argv[1])).get('configs', ''))
except (OSError, ValueError):
    print('')
" $OUT/dec7-sweep.json)
      echo "configs for the on side: ${CONFIGS:-kernel defaults}" | tee -a $L ;;
    off) side off ${SIDE_S:-45} 0 ;;
    on) side on ${SIDE_S:-45} table ;;
    tests) timeout $(left 10) python3 -m pytest $R/tests/kernels/test_skinny_gemm.py -q -p no:cacheprovider \
             -c $R/pyproject.toml --rootdir=$R > $OUT/dec7-tests.log 2>&1
      grep -E "Error|error:|passed|failed" $OUT/dec7-tests.log | tail -6 | tee -a $L ;;
    summary) python3 - <<'PY' 2>&1 | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
sides = {}
for label in ("off", "on"):
    try:
        sides[label] = json.load(open(f"{out}/dec7-{label}.json"))
    except (OSError, ValueError) as e:
        print(f"{label}: no result ({e.__class__.__name__})")
ms = {(l, r["batch"]): r["ms_per_step"] for l, s in sides.items() for r in s.get("latency", [])}
floors = {1: 4.05, 64: 5.41}
summary = {"ms_per_step": {f"{l} bs{b}": v for (l, b), v in ms.items()}, "floors_ms": floors}
for (l, b), v in sorted(ms.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{l:4s} bs{b:<3d} {v:.3f} ms/step (floor {floors.get(b)}: {'MET' if v <= floors.get(b, 0) else 'missed'})")
for b in (1, 64):
    if ("off", b) in ms and ("on", b) in ms:
        summary[f"on/off bs{b}"] = ms[("on", b)] / ms[("off", b)]
        print(f"bs{b}: on/off {ms[('on', b)] / ms[('off', b)]:.3f}")
if "tokens" in sides.get("off", {}) and "tokens" in sides.get("on", {}):
    a, b = sides["off"]["tokens"], sides["on"]["tokens"]
    same = sum(x == y for x, y in zip(a, b))
    first = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, b)]
    diff = sorted(i for i in first if i is not None)
    summary["tokens_identical_rows"] = same
    summary["first_difference_positions"] = diff
    print(f"greedy tokens, {len(a)} prompts decoded together: {same} rows identical; first differences at {diff}")
for label, s in sides.items():
    for p in s.get("profiles", []):
        groups = ", ".join(f"{g} {us:.0f}" for g, us in p["groups_us_per_step"].items())
        print(f"profile {label} bs{p['batch']}: wall {p['wall_us_per_step']:.0f} us, busy {p['gpu_busy_us_per_step']:.0f}, "
              f"{p['launches_per_step']:.0f} launches; {groups}")
        for k in p["kernels"][:10]:
            print(f"   {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f} {k['name'][:90]}")
json.dump(summary, open(f"{out}/dec7-summary.json", "w"), indent=1)
PY
      ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

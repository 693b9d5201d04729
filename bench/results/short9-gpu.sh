#!/bin/bash
# Issue 19's batch-64 decode floor (<= 5.41 ms at context 512): the bf16 decode attention at batch 64 x 512 took
# 38 us a layer in session 9's call 1 profile (~1.8 TB/s). One call (BUDGET_S, default 200 s), stages:
#   sweep  (90 s) bench/decode_short_ctx.py: tiles x splits at batch 64 x 512, the fastest 3 and the default at
#          4,096; writes the fastest as FLOTILLA_DECODE_BF16_LAUNCH / FLOTILLA_DECODE_WAVE
#   off    (50 s) bench/decode_ab.py batch 64 ctx 512 at the defaults: ms/step, profile, greedy tokens
#   on     (45 s) the same at the sweep's fastest launch (or SHORT9_ENV when set)
#   summary on/off and the attention kernel's time per step from the profiles
# Output: $OUT/short9.log (read first), $OUT/short9.json (sweep), $OUT/short9-sides.tgz (engine sides).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=200 bash bench/results/short9-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/short9.log; W=/tmp/short9; mkdir -p $W
for s in ${STAGES:-sweep off on summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    sweep) timeout $(left 90) python3 $R/bench/decode_short_ctx.py --json $OUT/short9.json --best $W/best.env \
        > $W/sweep.log 2>&1; echo "rc=$?" | tee -a $L; grep -v "Warning" $W/sweep.log | cut -c1-220 | tee -a $L ;;
    off|on) envs=""; [ $s = on ] && envs=${SHORT9_ENV:-$(cat $W/best.env 2>/dev/null)}
      echo "env: ${envs:-defaults}" | tee -a $L
      env $envs timeout $(left 50) python3 $R/bench/decode_ab.py --label $s --batch-sizes 64 --context 512 \
        --token-batch 64 --json $W/$s.json > $W/$s.log 2>&1
      echo "rc=$?" | tee -a $L; grep -E "ms/step|profile|decode_split|merge" $W/$s.log | cut -c1-200 | tee -a $L ;;
    summary) python3 - $W/off.json $W/on.json <<'PY' 2>&1 | tee -a $L
import json, sys
sides = {}
for path in sys.argv[1:]:
    try:
        sides[path.split("/")[-1][:-5]] = json.load(open(path))
    except (OSError, ValueError) as exc:
        print(f"{path}: no result ({type(exc).__name__})")
ms = {k: r["ms_per_step"] for k, v in sides.items() for r in v.get("latency", []) if r["batch"] == 64}
for k, v in ms.items():
    print(f"{k:4} bs64 ctx512: {v:.3f} ms/step (floor 5.41: {'met' if v <= 5.41 else 'missed'})")
if len(ms) == 2:
    print(f"on/off {ms['on'] / ms['off']:.3f}")
if len(sides) == 2 and all("tokens" in v for v in sides.values()):
    a, b = sides["off"]["tokens"], sides["on"]["tokens"]
    print(f"greedy tokens: {sum(x == y for x, y in zip(a, b))} of {len(a)} rows identical")
PY
      ;;
  esac
done
tar czf $OUT/short9-sides.tgz -C $W . 2>/dev/null
echo "=== done $(date +%T)" | tee -a $L

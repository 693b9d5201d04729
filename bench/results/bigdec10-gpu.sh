#!/bin/bash
# Where the offline run's pure decode steps lose time (issue 19's offline floor; bench/results/offline10-gpu.sh's
# trace: 239 decode steps at ~488 rows x ~576 tokens of context took 5.68 s, 51 % of their per-step bound): the
# engine's decode step at batch 256 and 512, context 576, and a per-kernel profile at 512 (GEMMs at M = 512 are
# compute-bound on cuBLAS, attention reads ~37 GB of K/V a step). ~90 s. Outputs: bigdec10.log, bigdec10.json.
#   BUDGET_S=100 bash bench/results/bigdec10-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 100
L=$OUT/bigdec10.log
echo "=== big $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
timeout $(left 95) python3 $R/bench/decode_ab.py --label big --batch-sizes 256,512 --profile-batch-sizes 512 \
  --context 576 --tokens 4 --steps 16 --profile-steps 8 --json $OUT/bigdec10.json > /tmp/bigdec10.out 2>&1
echo "rc=$?" | tee -a $L
grep -E "^big:|Error|error" /tmp/bigdec10.out | tail -6 | cut -c1-400 | tee -a $L
python3 - $OUT/bigdec10.json <<'PY' 2>&1 | tee -a $L
import json, sys
r = json.load(open(sys.argv[1]))
for p in r.get("profiles", []):
    print(f"profile batch {p['batch']}: wall {p['wall_us_per_step']:.0f} us, busy {p['gpu_busy_us_per_step']:.0f}")
    for k in p["kernels"][:14]:
        print(f"  {k['us_per_step']:9.1f} us x{k['launches_per_step']:.0f} {k['name'][:110]}")
PY

#!/bin/bash
# One side of a decode A/B on the H200 (bench/decode_ab.py in its own process: ms/step, per-kernel profile, tokens),
# from the repository root, carrying .whl (pydantic stack):
#   OUT=... BUDGET_S=N bash bench/results/gpu-2026-12-04-s12/ab.sh LABEL [decode_ab.py arguments...]
# Writes $OUT/LABEL.json (decode_ab's JSON) and $OUT/LABEL.log (its output); prints the ms/step lines and the
# profile's largest kernel groups.
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 120
label=$1; shift
timeout $(left 600) python3 $R/bench/decode_ab.py --label $label --json $OUT/$label.json "$@" > $OUT/$label.log 2>&1
echo "rc=$?"
grep -E "^$label:|Error|error" $OUT/$label.log | tail -8 | cut -c1-300
python3 - $OUT/$label.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r.get("profiles", []):
    keys = [k for k in p if not isinstance(p[k], (list, dict))]
    print({k: p[k] for k in keys})
    print("  groups us/step:", {k: round(v) for k, v in p.get("groups_us_per_step", {}).items()})
    for k in p.get("kernels", [])[:14]:
        print("  ", str(k)[:200])
PY

#!/bin/bash
# --calculate-kv-scales on the H200 (issue 22): the calculated scales reach the CUDA graphs. One call, ~90 s of
# device time (BUDGET_S, default 150): three engine processes on bench/model_dirs.py's small Llama (random init,
# k_proj/v_proj x 1e-3 so that scales 1.0 and calculated ones give different tokens), bf16, fp8 KV, 8 prompts x
# 32 greedy tokens each: calc (calculated scales, graphs), eager (calculated scales, --enforce-eager), unit
# (scales 1.0, graphs). Pass: calc == eager token for token, calc has graphed steps, calc != unit.
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=150 bash bench/results/kvscale-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/kvscale-gpu.log
for mode in calc eager unit; do
  timeout "$(left 60)" python3 $R/bench/kv_scales_graph_check.py /tmp/kvs-model $mode $OUT/kvscale-gpu-$mode.json \
    >> $L 2>&1 || echo "$mode: exit $?" | tee -a $L
done
python3 - $OUT <<'PY' | tee -a $L
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
r = {m: json.loads((out / f"kvscale-gpu-{m}.json").read_text()) for m in ("calc", "eager", "unit")
     if (out / f"kvscale-gpu-{m}.json").is_file()}
summary = {m: {k: v for k, v in x.items() if k != "tokens"} for m, x in r.items()}
if {"calc", "eager"} <= r.keys():
    summary["calc_equals_eager"] = r["calc"]["tokens"] == r["eager"]["tokens"]
    summary["pass"] = summary["calc_equals_eager"] and r["calc"]["graphed_steps"] > 0
if {"calc", "unit"} <= r.keys():
    summary["calc_differs_from_unit"] = r["calc"]["tokens"] != r["unit"]["tokens"]
(out / "kvscale-gpu-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PY

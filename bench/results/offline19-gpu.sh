#!/bin/bash
# Issue 19's offline floor (1,000 x (512 in / 128 out) >= 80 % of the FLOP bound) against the per-step token budget.
# With --max-num-batched-tokens 16,384 the run alternates ~32 compute-bound mixed steps (16k tokens, ~370 ms) with
# ~240 memory-bound pure-decode steps (~488 rows, ~25 ms): the decode rows pay for the weights and the KV reads on
# their own. A smaller budget spreads the prompts over more steps, so that each step carries its decode rows
# beside a prefill chunk that keeps the GEMMs compute-bound. This sweeps the budget (and the mixed-graph capture
# size), one process a budget, each with the step trace. ~70 s a budget.
# Run from the repository root on the GPU machine, carrying .whl (pydantic stack):
#   OFF19="16384 8192 4096 2048" BUDGET_S=330 bash bench/results/offline19-gpu.sh
# An entry "4096@4096" adds --max-cudagraph-capture-size 4096.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 330
L=$OUT/offline19.log
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for e in ${OFF19:-16384 8192 4096 2048}; do
  mnbt=${e%@*}; cap=; [ "$e" != "$mnbt" ] && cap="--max-cudagraph-capture-size ${e#*@}"
  echo "=== $e $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  FLOTILLA_STEP_TRACE=/tmp/steps-$e.jsonl timeout $(left 110) python3 $R/bench/throughput.py --model /tmp/llama8b \
    --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 \
    --max-num-batched-tokens $mnbt $cap --json $OUT/offline19-$e.json > /tmp/offline19-$e.out 2>&1
  echo "rc=$?" | tee -a $L
  python3 - "$OUT/offline19-$e.json" <<'PY' 2>&1 | tee -a $L
import json, sys
r = json.load(open(sys.argv[1]))
f = r["flotilla"]
print(f"RESULT {f['output_tokens_per_s']:.0f} output tok/s, {f['seconds']:.2f} s, fraction of bound {r['fraction_of_bound']:.3f}")
PY
  python3 $R/bench/step_trace_report.py /tmp/steps-$e.jsonl 2>&1 | tail -1 | cut -c1-1200 | tee -a $L
done
grep -E "^=== |RESULT" $L

#!/bin/bash
# Session 7, device call 1 (main 55b1ad0): the HTTP confirmation run after the client fix (issue 19), the int4 GEMV's
# GPU tests (issue 22), and a diagnostic of the cached-prefix TTFT with the engine's step trace (issue 19).
source bench/results/gpu-env.sh 590
L=$OUT/call1.log
stage() { echo "=== $1 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L; }
stage http6; (cd $R && STAGES="offline serve-on serve-off" BUDGET_S=$(left 310) bash bench/results/http6-gpu.sh) >> $L 2>&1
stage int4g; (cd $R && STAGES="tests" BUDGET_S=$(left 70) bash bench/results/int4g-gpu.sh) >> $L 2>&1
stage prefix
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
FLOTILLA_STEP_TRACE=$OUT/prefix-steps.jsonl timeout $(left 150) python3 $R/bench/prefix.py --model /tmp/llama8b \
  --load-format dummy --skip-batch --single-engine --prefix-len 2000 --suffix-len 20 --output-len 16 --repeats 5 \
  --max-num-batched-tokens 8192 --json $OUT/prefix-llama8b.json >> $OUT/prefix.log 2>&1
tail -5 $OUT/prefix.log >> $L
python3 -c "
import json; d=json.load(open('$OUT/prefix-llama8b.json')); print({k: v for k, v in d.items() if 'single' in k})" >> $L 2>&1
stage done

#!/bin/bash
# Issue 19's offline floor (1,000 x (512 in / 128 out) >= 80 % of the bound bench/throughput.py computes) on the
# H200: one run of the offline benchmark with the engine's step trace on (FLOTILLA_STEP_TRACE), so that the time
# can be split by step kind (pure prefill chunks, mixed, pure decode), tokens a step and graphed or eager steps.
# ~120 s (start-up ~15 s with --load-format dummy, the run ~18 s, the trace report). Outputs: offline10.log (read
# first), offline10.json (bench/throughput.py's result), steps.jsonl.gz (the trace: one line a step).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack):
#   BUDGET_S=170 bash bench/results/offline10-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 170
L=$OUT/offline10.log
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
echo "=== offline $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
FLOTILLA_STEP_TRACE=/tmp/steps.jsonl timeout $(left 150) python3 $R/bench/throughput.py --model /tmp/llama8b \
  --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 \
  --max-num-batched-tokens 16384 --json $OUT/offline10.json > /tmp/offline10.out 2>&1
echo "rc=$?" | tee -a $L
grep -vE "Warning|warn|eagerly" /tmp/offline10.out | tail -12 | cut -c1-400 | tee -a $L
echo "=== report $(date +%T)" | tee -a $L
python3 $R/bench/step_trace_report.py /tmp/steps.jsonl 2>&1 | cut -c1-3000 | tee -a $L
gzip -c /tmp/steps.jsonl > $OUT/steps.jsonl.gz

#!/bin/bash
# Session 27, the session's only device call (482 s of budget left over): on an H200 the bf16 half of session 25's
# one-row tile sweep (sweep25-gpu.sh, STAGES="bf16 summary", 290 s); on any other card the bf16 and fp8 batch-1
# fresh-engine figures of session 26's check.sh (without its knob tests), to compare with call 3 of session 26.
# From the repository root carrying .whl:   OUT=... bash bench/results/gpu-2026-12-06-s27/call1.sh
R0=$PWD
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$CARD" | tee $OUT/card.txt
if [[ "$CARD" == *H200* ]]; then
  OUT=$OUT STAGES="bf16 summary" BUDGET_S=290 bash bench/results/sweep25-gpu.sh
  exit
fi
source bench/results/gpu-env.sh 240
L=$OUT/check.log; : > $L
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
for q in bf16 fp8; do
  args=""; [ $q = fp8 ] && args="--quantization fp8"
  echo "=== $q $(date +%T)" | tee -a $L
  timeout $(left 110) python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name $q $args --jobs bs1 --max-num-seqs 16 \
    --json $OUT/$q.json > $OUT/$q.out 2>&1; echo "rc=$?" | tee -a $L
  python3 -c "import json; r=json.load(open('$OUT/$q.json'))['bs1']; print('$q bs1', round(r['ms_per_step'],4), 'ms')" 2>&1 | tee -a $L
done

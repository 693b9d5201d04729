#!/bin/bash
# Session 27, call 2 (≈ 390 s of budget left; an H100 offered): session 26's knob-parser GPU tests (knobs26-gpu.sh,
# 150 s) then bf16 decode batch 1 × context 512 in a fresh engine (quant_gpu.py --jobs bs1, as session 26's check.sh)
# to compare with session 26 call 3 (H100 entries 5.416 ms).
# From the repository root carrying .whl:   OUT=... bash bench/results/gpu-2026-12-06-s27/call2.sh
mkdir -p $OUT/knobs && OUT=$OUT/knobs BUDGET_S=150 bash bench/results/knobs26-gpu.sh
source bench/results/gpu-env.sh 110
L=$OUT/check.log; : > $L
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
echo "=== bf16 $(date +%T)" | tee -a $L
timeout $(left 105) python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name bf16 --jobs bs1 --max-num-seqs 16 \
  --json $OUT/bf16.json > $OUT/bf16.out 2>&1; echo "rc=$?" | tee -a $L
python3 -c "import json; r=json.load(open('$OUT/bf16.json'))['bs1']; print('bf16 bs1', round(r['ms_per_step'],4), 'ms')" 2>&1 | tee -a $L

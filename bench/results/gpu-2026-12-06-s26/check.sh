#!/bin/bash
# Session 26: main after the merges (knobs26's one launch-knob parser, lp26's sampler) on a GPU: the card's resolved
# knobs and the touched kernel files' GPU tests (bench/results/knobs26-gpu.sh), then bf16 and fp8 decode bs1 ctx 512
# in fresh engines (bench/quant_gpu.py --jobs bs1, as bf16ab.sh) against call 3's figures on the same card type.
# From the repository root carrying .whl:   OUT=... bash bench/results/gpu-2026-12-06-s26/check.sh
R0=$PWD
mkdir -p $OUT/knobs && OUT=$OUT/knobs BUDGET_S=200 bash bench/results/knobs26-gpu.sh
cd $R0 && source bench/results/gpu-env.sh 200
L=$OUT/check.log; : > $L
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
for q in bf16 fp8; do
  args=""; [ $q = fp8 ] && args="--quantization fp8"
  echo "=== $q $(date +%T)" | tee -a $L
  timeout $(left 90) python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name $q $args --jobs bs1 --max-num-seqs 16 \
    --json $OUT/$q.json > $OUT/$q.out 2>&1; echo "rc=$?" | tee -a $L
  python3 -c "import json; r=json.load(open('$OUT/$q.json'))['bs1']; print('$q bs1', round(r['ms_per_step'],4), 'ms')" 2>&1 | tee -a $L
done

#!/bin/bash
# Session 16, call 4: main after merging kv15 / fp8g15 / int4g15 with their defaults flipped, in one call:
# win14's stages on (bf16 bs1 + bs64 ctx 512), fp8 (bs1), int4 (bs1), then the fp8-KV step at bs64 x
# ctx 4,096 (bench/decode_ab.py). From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-05-s16/call4.sh
R0=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O/win14 $O/kv
OUT=$O/win14 BUDGET_S=190 STAGES="on fp8 int4 summary" bash bench/results/win14-gpu.sh > $O/win14.stdout 2>&1
( source bench/results/gpu-env.sh 85
  for spec in "fp8kv|--kv-cache-dtype fp8"; do
    label=${spec%%|*}; args=${spec#*|}
    echo "=== $label $(date +%T) ($((END - SECONDS)) s left)"; [ $((END - SECONDS)) -lt 40 ] && { echo skipped; continue; }
    timeout $(left 75) python3 $R/bench/decode_ab.py --label $label $args --batch-sizes 64 --context 4096 \
      --token-batch 1 --tokens 4 --json $O/kv/$label.json > $O/kv/$label.log 2>&1; echo "rc=$?"
    grep -E "^$label:" $O/kv/$label.log | tail -3 | cut -c1-300
  done ) > $O/kv/kv.txt 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; head -30 $O/win14/win14.log; cat $O/kv/kv.txt; } > $O/summary.txt
cd $O && tar czf call4.tgz win14 kv win14.stdout && rm -rf win14 kv win14.stdout
cat $O/summary.txt

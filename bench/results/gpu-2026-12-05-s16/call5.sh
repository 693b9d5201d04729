#!/bin/bash
# Session 16, call 5 (call 4 was taken back mid-run): main after merging kv15 / fp8g15 / int4g15 with their defaults
# flipped: win14's stages on (bf16 bs1 + bs64 ctx 512), fp8 (bs1), int4 (bs1) in one call. From the repository root
# of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s16/call5.sh
O=${OUT:-/tmp/out}; mkdir -p $O/win14
OUT=$O/win14 BUDGET_S=200 STAGES="on fp8 int4 summary" bash bench/results/win14-gpu.sh > $O/win14.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; head -40 $O/win14/win14.log; } > $O/summary.txt
cd $O && tar czf call5.tgz win14 win14.stdout && rm -rf win14 win14.stdout
cat $O/summary.txt

#!/bin/bash
# Queued by session 17 (no device lent: 90 s of budget left from session 16). The next session's first H200 call:
# main's headline decode figures and issue 22's ratios on the H200 (session 16 measured them on an H100 only).
#   win14 stages: bf16 bs1 + bs64 ctx 512 (defaults), fp8 bs1, bf16 bs64 ctx 4,096, int4 W4A16 bs1 (~300 s)
#   kv15 stages:  fp8-KV step bs64 x ctx 4,096 at main's default launch (h2 32/4/3, merged session 16) vs bf16 KV
# From the repository root of main, carrying .whl (the pydantic stack; see device/README):
#   OUT=... bash bench/results/gpu-2026-12-05-s17/callA.sh
O=${OUT:-/tmp/out}; mkdir -p $O/win14 $O/kv15
OUT=$O/win14 BUDGET_S=330 STAGES="on fp8 ctx4k int4 summary" bash bench/results/win14-gpu.sh > $O/win14.stdout 2>&1
OUT=$O/kv15 BUDGET_S=200 STAGES="fp8main bf16 summary" bash bench/results/kv15-gpu.sh > $O/kv15.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; head -40 $O/win14/win14.log; head -30 $O/kv15/kv15.log; } \
  > $O/summary.txt
cd $O && tar czf callA.tgz win14 kv15 win14.stdout kv15.stdout && rm -rf win14 kv15 win14.stdout kv15.stdout
cat $O/summary.txt

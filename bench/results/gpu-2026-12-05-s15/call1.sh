#!/bin/bash
# Session 15, call 1 (H200): main's figures after session 14's merge, and PDL-off per-kernel profiles that the
# session's kernel helpers start from. From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-05-s15/call1.sh
# 1. bench/results/win14-gpu.sh, all stages (bf16 on/off A/B, fp8 bs1, bf16 bs64 ctx 4,096, int4 bs1), 240 s
# 2. per-kernel profiles with FLOTILLA_PDL=0 (kernel times under PDL overlap are unusable): bf16 bs1 ctx 512,
#    --quantization fp8 bs1 ctx 512, bf16-KV and fp8-KV bs64 ctx 4,096 (decode_ab.py; each its own engine)
# 3. bench/results/offline10-gpu.sh (issue 19's offline floor, not measured since session 10), 170 s
R0=$PWD; O=${OUT:-/tmp/out}
mkdir -p $O/win14 $O/prof $O/offline
OUT=$O/win14 BUDGET_S=240 bash bench/results/win14-gpu.sh > $O/win14.stdout 2>&1
(
  source bench/results/gpu-env.sh 260
  for spec in "bf16-b1|--batch-sizes 1" "fp8-b1|--batch-sizes 1 --quantization fp8" \
              "bf16kv-b64c4k|--batch-sizes 64 --context 4096" "fp8kv-b64c4k|--batch-sizes 64 --context 4096 --kv-cache-dtype fp8"; do
    label=${spec%%|*}; args=${spec#*|}
    echo "=== $label $(date +%T) ($((END - SECONDS)) s left)"
    [ $((END - SECONDS)) -lt 30 ] && { echo skipped; continue; }
    FLOTILLA_PDL=0 timeout $(left 75) python3 $R/bench/decode_ab.py --label $label $args --token-batch 1 --tokens 4 \
      --profile-steps 8 --json $O/prof/$label.json 2>&1 | grep -vE "Warning|warn" | tail -4 | cut -c1-600
  done
) > $O/prof/prof.log 2>&1
cd $R0 && OUT=$O/offline BUDGET_S=170 bash bench/results/offline10-gpu.sh > $O/offline.stdout 2>&1
{ cat $O/prof/prof.log; head -40 $O/win14/win14.log; tail -25 $O/offline/offline10.log; } > $O/summary.txt
cd $O && tar czf call1.tgz win14 prof offline win14.stdout offline.stdout && rm -rf win14 prof offline *.stdout
cat $O/summary.txt  # $OUT returns at most 8 files: everything else is in call1.tgz

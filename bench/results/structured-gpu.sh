#!/bin/bash
# Issue 23's GPU figure (run 2026-12-03, results in bench/results/structured-gpu-2026-12-03.*): Llama-3.1-8B shape, random bf16 weights, batch 64, context 512:
# decode ms/step with a JSON-schema constraint on every request against none (target: within 10 %),
# and the compile time of a first and a second request with the same schema (target: the second ~0).
# Run from the repository root on the H200 machine, carrying in .whl/ the wheels of
# gpu-2026-12-03.sh (pydantic stack) plus xgrammar (cp312 manylinux wheel) and its pure-Python
# dependencies (ninja is not needed at run time). Output: $OUT/structured-llama8b.json and a log.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 300
echo "=== structured $(date +%T)" | tee -a $OUT/structured-gpu.log
timeout $((END - SECONDS)) python3 $R/bench/structured.py --shape llama-3.1-8b --batch 64 --context 512 --steps 64 \
  --json $OUT/structured-llama8b.json 2>&1 | grep -v INFO | tail -30 | tee -a $OUT/structured-gpu.log
echo "=== done $(date +%T)" | tee -a $OUT/structured-gpu.log

#!/bin/bash
# Session 23: issue 22's ratios in one call on whatever card comes (bf16, fp8 weights, fp8 KV, int4 W4A16, each
# against this call's bf16): decode bs1 ctx 512, bs64 ctx 4,096 (bf16 / fp8 KV), offline 1,000 x (512/128) (bf16 /
# fp8), KV blocks at 0.9; then the summary. From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s23/issue22.sh
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
BUDGET_S=${BUDGET_S:-565} LIMIT_PCT=${LIMIT_PCT:-160} STAGES="bf16 fp8 fp8kv int4 summary" bash bench/results/quant-gpu.sh

#!/bin/bash
# Session 25: the one-row tile sweep (bench/results/sweep25-gpu.sh) on an H200 only; returns at once on any other
# card. From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s25/try-h200-sweep.sh
cd "$(dirname "$0")/../../.." || exit 1
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$CARD"
[[ "$CARD" == *H200* ]] || exit 0
OUT=${OUT:-/tmp/out} BUDGET_S=${BUDGET_S:-540} bash bench/results/sweep25-gpu.sh

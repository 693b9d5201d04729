#!/bin/bash
# Session 25: a device call that does H200-only work and returns at once on any other card (the machine mostly lends
# H100s; issue 19/22's open floors are H200 floors). From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s25/try-h200.sh
# H200: session 24's call8.sh (fp8-KV lean A/B, early-query A/B, the retry test; <= 380 s).
cd "$(dirname "$0")/../../.." || exit 1
O=${OUT:-/tmp/out}; mkdir -p $O
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$CARD" | tee $O/card.txt
[[ "$CARD" == *H200* ]] || exit 0
OUT=$O bash bench/results/gpu-2026-12-06-s24/call8.sh

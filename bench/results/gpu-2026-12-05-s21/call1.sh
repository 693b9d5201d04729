#!/bin/bash
# Session 21, call 1: confirm session 20's rtn rounding fix on a GPU (rtn20-gpu.sh, ~3 min); if the card is an
# H200, also issue 19's offline / cached-prefix / attention figures (session 17's callB.sh, ~330 s).
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s21/call1.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $card"
mkdir -p $O/rtn && OUT=$O/rtn BUDGET_S=240 bash bench/results/rtn20-gpu.sh > $O/rtn/stdout.txt 2>&1
tail -12 $O/rtn/stdout.txt
case $card in *H200*) OUT=$O/b STEPS="offline prefix attn" bash bench/results/gpu-2026-12-05-s17/callB.sh ;; esac

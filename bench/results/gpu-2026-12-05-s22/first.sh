#!/bin/bash
# Session 22, first call (<= 9.5 min), by card: on an H200, issue 19's offline / cached-prefix / attention figures
# (session 17's callB.sh, ~330 s) then the per-kernel profile of a ~16k-token mixed step (~170 s); on any other card,
# session 21's call2.sh (rtn fix on a GPU, overlap probe, mixed-step profile).
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s22/first.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $card"
case $card in
  *H200*)
    OUT=$O STEPS="offline prefix attn" bash bench/results/gpu-2026-12-05-s17/callB.sh
    mkdir -p $O/mixed && ( source bench/results/gpu-env.sh 170
      timeout $(left 160) python3 $R/bench/mixed_step_profile.py --json $O/mixed/mixed.json > $O/mixed/mixed.log 2>&1
      echo "rc=$?" >> $O/mixed/mixed.log ) > $O/mixed/stdout.txt 2>&1
    grep -v " INFO \|^USDT" $O/mixed/mixed.log | tail -22
    cd $O && tar czf mixed.tgz mixed && rm -rf mixed ;;
  *) OUT=$O bash bench/results/gpu-2026-12-05-s21/call2.sh ;;
esac

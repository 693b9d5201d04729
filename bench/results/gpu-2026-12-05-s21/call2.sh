#!/bin/bash
# Session 21, call 2 (~9 min): (1) session 20's rtn rounding fix on a GPU (rtn20-gpu.sh); (2) probe21: can a decode
# step's GEMMs and attention overlap (bench/overlap_probe.py at 488/244 rows + the mixed-step case; session 11's
# extras skipped); (3) where a ~16k-token mixed step's time goes (bench/mixed_step_profile.py, 448 decode rows + 31
# prompts of 512: the offline run's compute-bound steps) -- issue 19's offline floor.
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s21/call2.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $O/card.txt
mkdir -p $O/rtn && OUT=$O/rtn BUDGET_S=210 bash bench/results/rtn20-gpu.sh > $O/rtn/stdout.txt 2>&1
tail -8 $O/rtn/stdout.txt
mkdir -p $O/probe && OUT=$O/probe BUDGET_S=170 PROBE_ARGS="--reps 10" bash bench/results/probe21-gpu.sh > $O/probe/stdout.txt 2>&1
tail -25 $O/probe/stdout.txt
mkdir -p $O/mixed && ( source bench/results/gpu-env.sh 170
  timeout $(left 160) python3 $R/bench/mixed_step_profile.py --json $O/mixed/mixed.json > $O/mixed/mixed.log 2>&1
  echo "rc=$?" >> $O/mixed/mixed.log ) > $O/mixed/stdout.txt 2>&1
grep -v " INFO \|^USDT" $O/mixed/mixed.log | tail -22
cd $O && tar czf call2.tgz rtn probe mixed && rm -rf rtn probe mixed

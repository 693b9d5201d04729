#!/bin/bash
# Session 21, helper probe21: the GEMV benchmarks after their timing loop moved into bench/timing.py (`time_variant`,
# `fastest`; behaviour meant unchanged, the LM head's rows now carry "ms" too). Checks on a GPU, ~1-2 min:
#   (1) tests/test_bench_timing.py (its CUDA test times a product through `time_variant`, and a failing variant);
#   (2) bench/fp8_gemv.py --rows 1: every variant timed, FP8GEMV / BEST lines as before (quant-gpu.sh's stage);
#   (3) bench/lm_head_gemv.py at Llama-3.1-8B's head, a 15 s grid: LMHEAD / BEST / SWITCH lines as before
#       (session 20's head20-gpu.sh on an H100: cuBLAS ~372 us, best GEMV ~335 us).
# $OUT (3 files): timing21.log (read first: GPU, each stage's rc and key lines), fp8-gemv.json, lm-head.json.
# Run from the repository root carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/timing21-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/timing21.log
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
echo "=== tests $(date +%T)" | tee -a $L
timeout $(left 40) python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs \
  $R/tests/test_bench_timing.py > /tmp/timing21-tests.log 2>&1
echo "rc=$?" | tee -a $L; tail -4 /tmp/timing21-tests.log | tee -a $L
echo "=== fp8_gemv $(date +%T)" | tee -a $L
timeout $(left 45) python3 $R/bench/fp8_gemv.py --rows 1 --json $OUT/fp8-gemv.json > /tmp/timing21-fp8.log 2>&1
echo "rc=$?" | tee -a $L; grep -E "^copy|^FP8GEMV|^BEST|Traceback|Error" /tmp/timing21-fp8.log | cut -c1-400 | tee -a $L
echo "=== lm_head_gemv $(date +%T)" | tee -a $L
timeout $(left 50) python3 $R/bench/lm_head_gemv.py --shapes llama-3.1-8b --budget-s 15 --json $OUT/lm-head.json \
  > /tmp/timing21-head.log 2>&1
echo "rc=$?" | tee -a $L; grep -E "^copy|^LMHEAD|^BEST|^SWITCH|Traceback|Error" /tmp/timing21-head.log | tail -14 \
  | cut -c1-300 | tee -a $L

#!/bin/bash
# Session 24, helper attn1: issue 19's decode attention at batch 1 x 4,096 (>= 2,000 GB/s on the H200; session 23:
# 9.77 us = 1,744 GB/s with the engine's launch). A split program asks for its first K/V only after two dependent L2
# round trips (the length, then the query row and the query, stored to shared memory ahead of the loop's first
# cp.async). One switch, off by default, applied by the env at small grids only (kernels/triton_paged_decode.py):
#   FLOTILLA_DECODE_EARLY_QUERY=1  the query read at the sequence's index in the first round trip ("query").
# (Its first run, H100 call 7 of bench/results/gpu-2026-12-06-s24, also timed FLOTILLA_DECODE_EAGER_TILE, since
# removed: docs/decode-gemm.md.)
# One call, BUDGET_S (default 150 s). Stages (STAGES, in this order, each under its own limit; rc=124: cut):
#   kernel  (95 s) bench/early_query_ab.py --workers 12 (every row compiled first in 12 processes), one timing
#           process: FLOOR lines (a 1-element add = one launch, a torch sum of 16.8 MB = a read of the K+V bytes, a
#           copy of 8.4 MB, in the same graph timing); b1e (batch 1, context 4,160 in a 4,288-token table: the issue's
#           figure) at each small launch (the default 64,4,3,256,fused+dep and four others) in forms plain / query,
#           A B B A x2 (plain only by PDL, "+early"); b1fix (the engine launch's grid and merge with one 64-key tile a
#           program: its fixed cost; b1e minus it = the streaming of the other 12.75 MB); b64s / b64l (batch 64 x
#           512 / 4,096: the general launch, which the env leaves alone; the forms passed explicitly show what they
#           would do there); b1 (4,096 in a 4,096 table). Lines: "<shape> <launch> <form>: us GB/s x<ratio> plain
#           (err vs default)", BEST per shape (the log: every line but b1's; kernel.out: all).
#   tests   (45 s) tests/kernels/test_paged_decode.py on the GPU with the switch on, the part that fits (expect
#           22 passed: every gpu-marked test, among them the graph replays of the early-query launches, every
#           small-launch test with the switch on, the mixed-step early query, the form at the fused 5-split launch
#           in fp32 and bf16; all 50: STAGES=tests BUDGET_S=200 with TESTS_K="").
# $OUT: attn24.log (read first), attn24.json (every row), kernel.out, tests.out.
# Run from the repository root carrying .whl (the pydantic stack), as the other scripts:
#   OUT=... bash bench/results/attn24-gpu.sh
# Flip it for the engine where "b1e default query" reads x < 1: FLOTILLA_DECODE_EARLY_QUERY=1, or the default in
# `_early_query_env`; a faster other launch: FLOTILLA_DECODE_SMALL_LAUNCH=<launch>
# (attn11-gpu.sh's off/on sides time the engine step with it).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/attn24.log
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
PYTEST="python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt"
TESTS="cuda or small_launch or early_query_in or query_env or (early_query_equals and launch2)"
for s in ${STAGES:-kernel tests}; do
  case $s in
    kernel) run_stage kernel 95 "^BEST|compiled" python3 $R/bench/early_query_ab.py --workers 12 --json $OUT/attn24.json
            grep -E "^FLOOR|^b1e |^b1fix|^b64" $OUT/kernel.out | cut -c1-200 | tee -a $L ;;
    tests) run_stage tests 45 "passed|failed|FAILED|assert" env FLOTILLA_DECODE_EARLY_QUERY=1 $PYTEST $R/tests/kernels/test_paged_decode.py -k "${TESTS_K-$TESTS}" ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

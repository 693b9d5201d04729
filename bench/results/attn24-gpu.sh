#!/bin/bash
# Session 24, helper attn1: issue 19's decode attention at batch 1 x 4,096 (>= 2,000 GB/s on the H200; session 23:
# 9.77 us = 1,744 GB/s with the engine's launch) with the eager first tile (FLOTILLA_DECODE_EAGER_TILE, off by
# default: each split program asks for its first K/V tile before the sequence's length and the query, two dependent
# L2 round trips, and folds it in after its loop; kernels/triton_paged_decode.py `_eager_tile`). One call, BUDGET_S
# (default 150 s). Stages (STAGES, in this order, each under its own limit; rc=124: cut):
#   kernel  (100 s) bench/eager_tile_ab.py --workers 12 (every row compiled first in 12 processes): in one process,
#           batch 1 in the engine's conditions (context 4,160 in a 4,288-token table: the issue's figure) and at
#           4,096 in a 4,096 table, each small launch (the default 64,4,3,256,fused+dep and five others) with the
#           switch off and on in A B B A order (x2), then batch 64 x 512 and 64 x 4,096 (the general launch: the
#           env switch leaves it alone; the rows pass eager_tile explicitly to show what it would cost there).
#           Also where the 9.77 us go: FLOOR lines (in the same graph timing: a 1-element add = one launch, a torch
#           sum of 16.8 MB = a read of the K+V bytes, a copy of 8.4 MB), and b1fix (the engine launch's grid and
#           merge, 17 splits x 8 KV heads, with one 64-key tile a program: b1e default minus it = the streaming of
#           the other 12.75 MB). Lines: "<shape> <launch> eager 0|1: us GB/s (err vs default)",
#           "AB <shape> <launch>: eager/plain", FLOOR, BEST.
#   tests   (40 s) tests/kernels/test_paged_decode.py on the GPU with FLOTILLA_DECODE_EAGER_TILE=1 (expect 49 passed:
#           the compiled eager tests, the graph replays of the eager launches, every small-launch test with the switch
#           on; test_small_launch_with_wide_tiles_equals_the_default_at_short_context asks for bit equality with the
#           general launch at one 64-key tile, which the interpreter shows but the GPU may not: a failure there alone
#           is a rounding, not a wrong result).
# $OUT: attn24.log (read first), attn24.json (every row), kernel.out, tests.out.
# Run from the repository root carrying .whl (the pydantic stack), as the other scripts:
#   OUT=... bash bench/results/attn24-gpu.sh
# Flip it for the engine (if "AB b1e default" < 1): FLOTILLA_DECODE_EAGER_TILE=1, or the default in
# `_eager_tile_env`; a faster other launch: FLOTILLA_DECODE_SMALL_LAUNCH=<launch> (attn11-gpu.sh's off/on sides).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/attn24.log
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
PYTEST="python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt"
for s in ${STAGES:-kernel tests}; do
  case $s in
    kernel) run_stage kernel 100 "eager [01]:|^AB |^BEST|^FLOOR|compiled" python3 $R/bench/eager_tile_ab.py --workers 12 \
              --json $OUT/attn24.json ;;
    tests) run_stage tests 40 "passed|failed|FAILED|assert" env FLOTILLA_DECODE_EAGER_TILE=1 $PYTEST \
             $R/tests/kernels/test_paged_decode.py ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

#!/bin/bash
# Session 24's last device call, by card (≤ 380 s). From the repository root of main, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s24/call8.sh
# H200 (issue 19/22's card): the two switches this session left off because the H100 could not show them —
#   kvfp8's FLOTILLA_DECODE_FP8_LEAN (fp8-KV attention at 64 x 4,096 + the engine step A/B) and attn1's
#   FLOTILLA_DECODE_EARLY_QUERY (batch-1 attention) — then the GPU tests of this session's engine changes.
# (there: retry24's GPU test only, the time is short)
# Any other card: the GPU tests only (retry24's failed-start memory test, the memory profile's graph tests,
#   the decode-attention tests with the early query on).
cd "$(dirname "$0")/../../.." || exit 1
O=${OUT:-/tmp/out}; mkdir -p $O
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$CARD" | tee $O/card.txt
if [[ "$CARD" == *H200* ]]; then
  mkdir -p $O/kvfp8 $O/attn
  OUT=$O/kvfp8 BUDGET_S=190 bash bench/results/kvfp8-24-gpu.sh > $O/kvfp8.stdout 2>&1
  OUT=$O/attn BUDGET_S=110 STAGES=kernel bash bench/results/attn24-gpu.sh > $O/attn.stdout 2>&1
  TESTS_BUDGET=60; TESTS="tests/engine/test_start_failure.py"
else
  TESTS_BUDGET=300
  TESTS="tests/engine/test_start_failure.py tests/engine/test_memory_profile.py tests/kernels/test_paged_decode.py"
fi
source bench/results/gpu-env.sh $TESTS_BUDGET > /dev/null 2>&1
timeout $((TESTS_BUDGET - 5)) env FLOTILLA_DECODE_EARLY_QUERY=1 python3 -m pytest -p no:cacheprovider \
  -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt $(for t in $TESTS; do echo $R/$t; done) -m gpu > $O/tests.out 2>&1
echo "tests rc=$?" >> $O/tests.out
{ cat $O/card.txt; head -25 $O/kvfp8/kvfp8.log 2>/dev/null; grep -E "^BEST|^b1e|^FLOOR" $O/attn/attn24.log 2>/dev/null | cut -c1-160; tail -4 $O/tests.out; } > $O/summary.txt
cd $O && tar czf call8.tgz $(ls | grep -v summary.txt) && find . -mindepth 1 -not -name call8.tgz -not -name summary.txt -exec rm -rf {} + 2>/dev/null
cat $O/summary.txt

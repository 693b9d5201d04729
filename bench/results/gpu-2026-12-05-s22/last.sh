#!/bin/bash
# Session 22, second call (<= 9.5 min): mixattn22's A/B (FLOTILLA_MIXED_DECODE_SPLIT off/on in a 16k-token mixed
# step, the prompt-launch sweep, its GPU tests; ~320 s), then the GPU tests of sessions 21-22 (tests.sh, ~240 s).
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s22/last.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
mkdir -p $O/mixattn $O/tests
OUT=$O/mixattn BUDGET_S=${M_BUDGET:-320} STAGES=${M_STAGES:-"kernel off on tests best"} bash bench/results/mixattn22-gpu.sh > $O/mixattn/stdout.txt 2>&1
cat $O/mixattn/mixattn22.log | cut -c1-300 | tail -60
OUT=$O/tests BUDGET_S=${T_BUDGET:-235} bash bench/results/gpu-2026-12-05-s22/tests.sh > $O/tests/stdout.txt 2>&1
tail -25 $O/tests/summary.txt
cd $O && tar czf last.tgz mixattn tests && rm -rf mixattn tests

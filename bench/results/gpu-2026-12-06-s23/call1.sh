#!/bin/bash
# Session 23, first call (<= 9.5 min), by card: on an H200, session 22's first.sh (issue 19's offline / cached-prefix /
# attention figures + the mixed-step profile); on any other card, session 22's offline-ab.sh (offline run with the
# mixed decode split off / on, ~3 min) then its tests.sh (GPU tests of sessions 21-22's changes, 300 s).
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-06-s23/call1.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
S22=bench/results/gpu-2026-12-05-s22
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $card"
case $card in
  *H200*) OUT=$O bash $S22/first.sh ;;
  *) ( OUT=$O BUDGET_S=215 bash $S22/offline-ab.sh ); ( OUT=$O BUDGET_S=300 bash $S22/tests.sh ) ;;
esac

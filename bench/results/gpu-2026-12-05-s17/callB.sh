#!/bin/bash
# Queued by session 17: the next session's second H200 call, issue 19's end-to-end figures on main.
#   offline10: 1,000 x (512 in / 128 out) with the step trace (floor 0.80 of the FLOP bound)        ~120 s
#   prefix7:   TTFT of a request whose 2,000-token prefix is cached vs not (floor 10x)               ~80 s
#   attn11:    paged decode attention at batch 1 x 4,096 (floor 2,000 GB/s), kernel stage only      ~45 s
#   http6:     `flotilla serve` vs offline through HTTP, 512 streams (floor 90 %), main's defaults  ~300 s
# That is more than one 600 s call: run it as two (STEPS="offline prefix attn", then STEPS="http").
# .whl: the wheels bench/results/http-speed-gpu.sh lists (pydantic + HTTP stacks; `pip download --no-deps` them here).
# From the repository root of main, carrying .whl:   OUT=... STEPS="..." bash bench/results/gpu-2026-12-05-s17/callB.sh
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/../../.." || exit 1
for s in ${STEPS:-offline prefix attn}; do
  mkdir -p $O/$s
  case $s in
    offline) OUT=$O/$s BUDGET_S=150 bash bench/results/offline10-gpu.sh ;;
    prefix) OUT=$O/$s BUDGET_S=100 STAGES="on" bash bench/results/prefix7-gpu.sh ;;
    attn) OUT=$O/$s BUDGET_S=80 STAGES="kernel summary" bash bench/results/attn11-gpu.sh ;;
    http) OUT=$O/$s BUDGET_S=420 STAGES="offline serve-on" bash bench/results/http6-gpu.sh ;;
  esac > $O/$s.stdout 2>&1
done
{ nvidia-smi --query-gpu=name --format=csv,noheader; for s in ${STEPS:-offline prefix attn}; do
    echo "=== $s"; head -30 $O/$s/*.log 2>/dev/null; done; } > $O/summary.txt
cd $O && tar czf callB.tgz $(ls -d */ *.stdout) && rm -rf */ *.stdout
cat $O/summary.txt

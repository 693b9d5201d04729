#!/bin/bash
# Session 7, device call 3: branches qgemv7 @bcf1711 (word-per-lane quantized GEMV), dec7 @6d28247 (skinny bf16 GEMM),
# prefix7 @f2f5ada (cached-prefix TTFT, round 2); each from a `git archive` in .scratch/<branch>; packed into $OUT/call3.tgz.
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o3; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $W/call3.log; }
for b in qgemv7 dec7 prefix7; do ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; done
stage qgemv7; (cd .scratch/qgemv7 && OUT=$W/qgemv7 BUDGET_S=150 timeout 160 bash bench/results/qgemv7-gpu.sh) >> $W/call3.log 2>&1
stage dec7; (cd .scratch/dec7 && OUT=$W/dec7 BUDGET_S=150 timeout 160 bash bench/results/dec7-gpu.sh) >> $W/call3.log 2>&1
stage prefix7; (cd .scratch/prefix7 && OUT=$W/prefix7 BUDGET_S=180 timeout 190 bash bench/results/prefix7-gpu.sh) >> $W/call3.log 2>&1
stage done
tar czf $FINAL/call3.tgz -C $W . ; cp $W/call3.log $FINAL/

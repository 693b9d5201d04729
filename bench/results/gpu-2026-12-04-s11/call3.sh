#!/bin/bash
# Session 11, device call 3: branches attn11 @504bc10, prefix11 @74dac26, fp8kv11 @00c8a40, each from a `git archive`
# in .scratch/<branch>, each under a fixed BUDGET_S and a hard timeout; outputs packed into $OUT/call3-<branch>.tgz.
#   BRANCHES="attn11:150 prefix11:150 fp8kv11:150" bash bench/results/gpu-2026-12-04-s11/call3.sh
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o3; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call3.log; }
one() {  # branch budget
  local b=$1 budget=$2
  ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; stage $b
  (cd .scratch/$b && OUT=$W/$b BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$b-gpu.sh) > $W/$b.stdout 2>&1
  tar czf $FINAL/call3-$b.tgz -C $W $b $b.stdout
}
for spec in ${BRANCHES:-attn11:150 prefix11:150 fp8kv11:150}; do one ${spec%%:*} ${spec##*:}; done
stage done

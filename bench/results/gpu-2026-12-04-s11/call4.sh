#!/bin/bash
# Session 11, device call 4: main @904b140 (dec7-gpu.sh at ctx 512 with the new small-grid attention launch), branches pdl64 @7e02dd3, fp8kv11 @94dae47, prefix11 @54aa14c, each from a `git archive`
# in .scratch/<branch>, each under a fixed BUDGET_S and a hard timeout; outputs packed into $OUT/call4-<branch>.tgz.
#   BRANCHES="main:90 pdl64:150 fp8kv11:150 prefix11:150" bash bench/results/gpu-2026-12-04-s11/call4.sh
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o4; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call4.log; }
one() {  # branch budget
  local b=$1 budget=$2
  ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; stage $b
  local script=bench/results/$b-gpu.sh envs=(X=1)
  [ $b = main ] && { script=bench/results/dec7-gpu.sh; envs=("STAGES=on summary" SIDE_S=70); }
  (cd .scratch/$b && env "${envs[@]}" OUT=$W/$b BUDGET_S=$budget timeout $((budget + 10)) bash $script) > $W/$b.stdout 2>&1
  tar czf $FINAL/call4-$b.tgz -C $W $b $b.stdout
}
for spec in ${BRANCHES:-main:90 pdl64:150 fp8kv11:150 prefix11:150}; do one ${spec%%:*} ${spec##*:}; done
stage done

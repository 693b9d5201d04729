#!/bin/bash
# Session 12, device call N: helper branches (shas in callN.log), each from a `git archive`
# in .scratch/<branch>, each under a fixed BUDGET_S and a hard timeout; outputs packed into $OUT/call$N-<branch>.tgz.
#   N=2 BRANCHES="norm12:200 attn12:180" bash bench/results/gpu-2026-12-04-s12/branches.sh
N=${N:?}; T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o$N; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call$N.log; }
one() {  # branch budget
  local b=$1 budget=$2
  ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; stage $b
  (cd .scratch/$b && OUT=$W/$b BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$b-gpu.sh) > $W/$b.stdout 2>&1
  tar czf $FINAL/call$N-$b.tgz -C $W $b $b.stdout
}
for spec in $BRANCHES; do one ${spec%%:*} ${spec##*:}; done
stage done

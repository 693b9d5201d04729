#!/bin/bash
# Session 10, device call 5: this session's branches, each from a `git archive` in .scratch/<branch>, each under a
# fixed BUDGET_S and a hard timeout; outputs packed into $OUT/call5-<branch>.tgz as soon as each ends.
#   BRANCHES="kv10:200 host10:150" bash bench/results/gpu-2026-12-04-s10/call5.sh
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o5; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call5.log; }
one() {  # branch budget
  local b=$1 budget=$2
  ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; stage $b
  (cd .scratch/$b && OUT=$W/$b BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$b-gpu.sh) > $W/$b.stdout 2>&1
  tar czf $FINAL/call5-$b.tgz -C $W $b $b.stdout
}
for spec in ${BRANCHES:-kv10:200 host10:150}; do one ${spec%%:*} ${spec##*:}; done
stage done

#!/bin/bash
# Session 10, device call 6: qgemv10 @3feefe7 (the int4 wide GEMV after its call-4 run: fast nibble planes, register
# prefetch) and pdl10 @4404fba (PDL kept to one row and off for the fp8 GEMV), from `git archive`s in .scratch/.
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o6; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call6.log; }
one() {  # branch budget [env assignments...]
  local b=$1 budget=$2; shift 2
  ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; stage $b
  (cd .scratch/$b && env "$@" OUT=$W/$b BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$b-gpu.sh) > $W/$b.stdout 2>&1
  tar czf $FINAL/call6-$b.tgz -C $W $b $b.stdout
}
one qgemv10 215
one pdl10 170 "STAGES=off on fp8on fp8off summary"
stage done

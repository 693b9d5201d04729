#!/bin/bash
# Session 9, device call 4: branches dec8b @c091e3f and prefix8 @0f0eeeb, each from a `git archive` in
# .scratch/<branch>, each under a fixed BUDGET_S and a hard timeout; outputs packed into $OUT/call4-<branch>.tgz.
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o4; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call4.log; }
one() {  # branch budget
  ln -sfn $ROOT/.whl $ROOT/.scratch/$1/.whl; stage $1
  (cd .scratch/$1 && OUT=$W/$1 BUDGET_S=$2 timeout $(($2 + 10)) bash bench/results/$1-gpu.sh) > $W/$1.stdout 2>&1
  tar czf $FINAL/call4-$1.tgz -C $W $1 $1.stdout
}
one dec8b 175; one prefix8 165
stage done

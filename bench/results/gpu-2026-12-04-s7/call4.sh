#!/bin/bash
# Session 7, device call 4 (the last; call 3 was lost when the machine was taken back): branches qgemv7, kv7, dec7,
# prefix7 (commits in the README), each from a `git archive` in .scratch/<branch>, each under a fixed BUDGET_S and a
# hard timeout; each branch's outputs are packed into $OUT/call4-<branch>.tgz as soon as it ends.
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o4; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call4.log; }
one() {  # branch budget
  ln -sfn $ROOT/.whl $ROOT/.scratch/$1/.whl; stage $1
  (cd .scratch/$1 && OUT=$W/$1 BUDGET_S=$2 timeout $(($2 + 10)) bash bench/results/$1-gpu.sh) > $W/$1.stdout 2>&1
  tar czf $FINAL/call4-$1.tgz -C $W $1 $1.stdout
}
one qgemv7 130; one kv7 120; one dec7 120; one prefix7 100
stage done

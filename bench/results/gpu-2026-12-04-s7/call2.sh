#!/bin/bash
# Session 7, device call 2: branches prefix7 @06f8652 (cached-prefix TTFT levers) and kv7 @250e64f (paged decode
# kernel variants), then main's int4 GEMV GPU tests (their log was lost in call 1). Each branch runs from a
# `git archive` of it in .scratch/<branch>; everything is packed into $OUT/call2.tgz.
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o2; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $W/call2.log; }
for b in prefix7 kv7; do ln -sfn $ROOT/.whl $ROOT/.scratch/$b/.whl; done
stage prefix7; (cd .scratch/prefix7 && OUT=$W/prefix7 BUDGET_S=200 timeout 215 bash bench/results/prefix7-gpu.sh) >> $W/call2.log 2>&1
stage kv7; (cd .scratch/kv7 && OUT=$W/kv7 BUDGET_S=240 timeout 250 bash bench/results/kv7-gpu.sh) >> $W/call2.log 2>&1
stage int4g; (OUT=$W/int4g STAGES=tests BUDGET_S=60 timeout 70 bash bench/results/int4g-gpu.sh) >> $W/call2.log 2>&1
cat $W/int4g/int4g-tests.log 2>/dev/null | tail -15 >> $W/call2.log
stage done
tar czf $FINAL/call2.tgz -C $W . ; cp $W/call2.log $FINAL/

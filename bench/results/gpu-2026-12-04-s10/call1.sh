#!/bin/bash
# Session 10, device call 1: main at the start of the session, the scripts' own commands, each under a fixed
# BUDGET_S and a hard timeout; each run's outputs are packed into $OUT/call1-<name>.tgz as soon as it ends.
#   dec7 at CTX=4096 (issue 19's batch-64 x ctx-4,096 <= 1.12x roofline, never measured), then kv7: the fp8 KV
#   default launch merged in session 9 (32/2/4 cvtpx, 2 key streams) through the engine step and the GPU tests.
T0=$SECONDS; FINAL=$OUT; W=/tmp/o1; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call1.log; }
one() {  # name budget script [env assignments...]
  local name=$1 budget=$2 script=$3; shift 3; stage $name
  (env "$@" OUT=$W/$name BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$script) > $W/$name.stdout 2>&1
  tar czf $FINAL/call1-$name.tgz -C $W $name $name.stdout
}
one dec7ctx4096 120 dec7-gpu.sh "STAGES=on summary" CTX=4096 SIDE_S=105
one kv7 175 kv7-gpu.sh "STAGES=fp8kv bf16 tests summary"
stage done

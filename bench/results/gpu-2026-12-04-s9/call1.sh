#!/bin/bash
# Session 9, device call 1 (session 8 ran this and lost its results when its machine was shut down): main as merged at the end of session 7 (b6a2748), the scripts' own commands, each under
# a fixed BUDGET_S and a hard timeout; each run's outputs are packed into $OUT/call1-<name>.tgz as soon as it ends.
T0=$SECONDS; FINAL=$OUT; W=/tmp/o1; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call1.log; }
one() {  # name budget script [env assignments...]
  local name=$1 budget=$2 script=$3; shift 3; stage $name
  (env "$@" OUT=$W/$name BUDGET_S=$budget timeout $((budget + 10)) bash bench/results/$script) > $W/$name.stdout 2>&1
  tar czf $FINAL/call1-$name.tgz -C $W $name $name.stdout
}
one kv7 175 kv7-gpu.sh KV7_FP8_LAUNCH=32,2,4,cvtpx,2 "STAGES=fp8kv bf16 tests summary"
one dec7 100 dec7-gpu.sh "STAGES=off on summary"
one prefix7 120 prefix7-gpu.sh
one int4g 110 int4g-gpu.sh "STAGES=int4 bf16 summary"
stage done

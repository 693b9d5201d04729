#!/bin/bash
# Session 11, device call 5: main @633fa39 as merged this session (small-grid attention launch 64,4,3,256,fused+dep;
# fp8 KV transposed streams; tidy11's switches; op11/op11b's LoRA-on-quantized layers), from a `git archive` in
# .scratch/main:
#   dec      bench/results/dec7-gpu.sh STAGES="on summary" (ctx 512, bs1 / bs64, profile at 64)
#   dec-nosmall  the same with FLOTILLA_DECODE_SMALL_LAUNCH=0 (the general attention launch at bs1, as before)
#   kv       bench/results/kv7-gpu.sh STAGES="fp8kv bf16 summary" (fp8 KV vs bf16 KV step, bs64 x ctx 4,096)
#   lora     bench/results/op11b-gpu.sh (LoRA on rtn 4-bit layers on CUDA: graphs == eager, fp32 == CPU)
#   bash bench/results/gpu-2026-12-04-s11/call5.sh   (carrying .whl and .scratch)
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o5; mkdir -p $W
ln -sfn $ROOT/.whl $ROOT/.scratch/main/.whl
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call5.log; }
one() {  # name budget script [env...]
  local n=$1 budget=$2 script=$3; shift 3; stage $n
  (cd .scratch/main && env "$@" OUT=$W/$n BUDGET_S=$budget timeout $((budget + 10)) bash $script) > $W/$n.stdout 2>&1
  tar czf $FINAL/call5-$n.tgz -C $W $n $n.stdout
}
one dec 70 bench/results/dec7-gpu.sh "STAGES=on summary" SIDE_S=60
one dec-nosmall 60 bench/results/dec7-gpu.sh "STAGES=on summary" SIDE_S=50 FLOTILLA_DECODE_SMALL_LAUNCH=0
one kv 150 bench/results/kv7-gpu.sh "STAGES=fp8kv bf16 summary"
one lora 130 bench/results/op11b-gpu.sh X=1
stage done

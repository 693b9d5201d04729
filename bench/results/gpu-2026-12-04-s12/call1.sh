#!/bin/bash
# Session 12, device call 1: main as committed (the call's sha in call1.log), from the repository root:
#   lora    bench/results/op11b-gpu.sh: session 11's rtn 4-bit zero-point fix + LoRA on rtn4 on CUDA (not yet run)
#   fp8w    ab.sh: --quantization fp8, bs1 ctx 512: step and per-kernel profile (issue 22's fp8 <= 0.62x bf16)
#   bf16    ab.sh: bf16, bs1 and bs64 ctx 512: step and profiles (issue 19's 4.05 / 5.41 ms; fp8w's reference)
#   kvfp8   ab.sh: --kv-cache-dtype fp8, bs64 x ctx 4,096: step and profile (issue 22's <= 0.70x bf16 KV)
#   kvbf16  ab.sh: bf16 KV, bs64 x ctx 4,096: step and profile
#   bash bench/results/gpu-2026-12-04-s12/call1.sh   (carrying .whl)
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o1; mkdir -p $W
D=bench/results/gpu-2026-12-04-s12
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call1.log; }
one() {  # name budget script [args...]
  local n=$1 budget=$2 script=$3; shift 3; stage $n
  (cd $ROOT && OUT=$W/$n BUDGET_S=$budget timeout $((budget + 10)) bash $script "$@") > $W/$n.stdout 2>&1
  tail -30 $W/$n.stdout >> $FINAL/call1.log
  tar czf $FINAL/call1-$n.tgz -C $W $n $n.stdout
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> $FINAL/call1.log 2>&1
one lora 150 bench/results/op11b-gpu.sh
one fp8w 75 $D/ab.sh fp8w --quantization fp8 --batch-sizes 1 --token-batch 1
one bf16 80 $D/ab.sh bf16 --batch-sizes 1,64 --token-batch 1
one kvfp8 100 $D/ab.sh kvfp8 --kv-cache-dtype fp8 --batch-sizes 64 --context 4096 --token-batch 1
one kvbf16 90 $D/ab.sh kvbf16 --batch-sizes 64 --context 4096 --token-batch 1
stage done

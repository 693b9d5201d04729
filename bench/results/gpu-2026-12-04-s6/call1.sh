#!/bin/bash
# Session 6, device call 1: diagnostics for the helpers (fp8 KV decode sweep, LoRA / bf16 / fp8 decode profiles,
# offline prefill profile).
source bench/results/gpu-env.sh 540
L=$OUT/call1.log
P="python3 $R/bench/results/gpu-2026-12-04-s6/prof6.py"
stage() { echo "=== $1 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L; }
stage fp8kv; (cd $R && timeout $(left 130) python3 bench/fp8_kv_decode.py --json $OUT/fp8-kv-decode.json --batches 64,1) >> $L 2>&1
stage lora64; timeout $(left 110) $P decode --batch 64 --lora 8 --json $OUT/prof-lora8-b64.json >> $L 2>&1
stage bf16-64; timeout $(left 80) $P decode --batch 64 --json $OUT/prof-bf16-b64.json >> $L 2>&1
stage fp8-1; timeout $(left 80) $P decode --batch 1 --kw '{"quantization": "fp8"}' --json $OUT/prof-fp8-b1.json >> $L 2>&1
stage offline; timeout $(left 140) $P offline --json $OUT/prof-offline.json >> $L 2>&1
stage done

#!/bin/bash
# Session 27 call 3: the first two engines of session 26 bf16ab.sh (old knobs forced by env, then the default), after call 2 gave 5.539 ms for the default.
# Session 26 (queue item 3 of session 25): the H100's bf16 one-row entries (triton_gemv.ONE_ROW_TILES,
# triton_gated_gemv.ONE_ROW_CONFIGS, adopted from session 25 call 5's in-engine sweep) checked in FRESH engines on
# one machine, and the LM head knobs that sweep also chose (FLOTILLA_LM_HEAD_GEMV, not adopted). Four processes,
# A B C A: old = the knobs the engine used before the entries (the sweep's start_table, forced by env), new = the
# default (the card's entries), new+lm = the default plus the sweep's LM head knobs. bench/quant_gpu.py --jobs bs1
# (bf16 decode batch 1, context 512, Llama-3.1-8B shape, random weights). From the repository root carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s26/bf16ab.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 150
L=$OUT/bf16ab.log; : > $L
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
OLD_GEMV="6144x4096:bn=16,bk=512,sk=1,w=4,s=2;4096x4096:bn=8,bk=512,sk=1,w=4,s=2;4096x14336:bn=8,bk=512,sk=1,w=4,s=2"
OLD_GATED="bn=4,bk=512,w=4,s=3"
LM="bn=16,bk=1024,sk=1,w=4,s=1,dot=0"
one() {  # one NAME ENV...
  local name=$1; shift
  echo "=== $name $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  env "$@" timeout $(left 70) python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name $name --jobs bs1 \
    --max-num-seqs 16 --json $OUT/$name.json > $OUT/$name.out 2>&1
  echo "rc=$?" | tee -a $L
  python3 -c "import json,sys; r=json.load(open('$OUT/$name.json'))['bs1']; print('$name', round(r['ms_per_step'],4), 'ms')" 2>&1 | tee -a $L
}
one old1 FLOTILLA_GEMV_CONFIG="$OLD_GEMV" FLOTILLA_GATED_GEMV_CONFIG="$OLD_GATED"
one new1 X=1



#!/bin/bash
# Session 27 call 4 (the command as run, on the warm H100 of calls 2-3): fp8 then bf16 decode batch 1 x context 512
# in fresh engines (bench/quant_gpu.py --jobs bs1). From the repository root carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s27/call4.sh
source bench/results/gpu-env.sh 120 >/dev/null; python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b >/dev/null; for q in fp8 bf16; do a=""; [ $q = fp8 ] && a="--quantization fp8"; timeout 60 python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name $q $a --jobs bs1 --max-num-seqs 16 --json $OUT/$q.json > $OUT/$q.out 2>&1; echo rc=$?; python3 -c "import json; r=json.load(open('$OUT/$q.json'))['bs1']; print('$q bs1', round(r['ms_per_step'],4), 'ms')"; done

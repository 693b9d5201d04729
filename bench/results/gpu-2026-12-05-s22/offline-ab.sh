#!/bin/bash
# Session 22, third call (~3 min): the offline run 1,000 x (512 in / 128 out) with FLOTILLA_MIXED_DECODE_SPLIT off,
# then on (mixattn22: a mixed step's decode rows through the decode kernel), same engine settings as offline10-gpu.sh;
# then the fp8 operand-path test the second call found failing (a caller's key_streams=1 under the pool's "h2" form).
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s22/offline-ab.sh
source bench/results/gpu-env.sh 240
L=$OUT/offline-ab.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
for s in 0 1; do
  echo "=== split=$s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  FLOTILLA_MIXED_DECODE_SPLIT=$s timeout $(left 90) python3 $R/bench/throughput.py --model /tmp/llama8b \
    --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 \
    --max-num-batched-tokens 16384 --json $OUT/offline-split$s.json > /tmp/off$s.out 2>&1
  echo "rc=$?" | tee -a $L
  python3 -c "import json; d=json.load(open('$OUT/offline-split$s.json')); f=d['flotilla']; print('output tok/s', round(f['output_tokens_per_s']), 's', round(f['seconds'], 3), 'fraction_of_bound', round(d['fraction_of_bound'], 4), 'fraction_of_serial', round(d['fraction_of_serial'], 4))" 2>&1 | tee -a $L
done
echo "=== test $(date +%T)" | tee -a $L
timeout $(left 60) python3 -m pytest -m gpu -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
  "$R/tests/kernels/test_fp8_kv_cache.py::test_cuda_fp8_operand_paths_at_llama_heads" 2>&1 | tail -3 | tee -a $L

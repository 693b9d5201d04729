#!/bin/bash
# The device commands behind bench/results/gpu-*-2026-12-02-s2*.json (second session of 2026-12-02:
# mixed-step CUDA graphs, split-KV extend attention, asynchronous scheduling). Run from the repository
# root on the H200 machine, carrying .whl (pydantic 2.14.4, pydantic-core 2.50.5, annotated-types,
# typing-inspection, typing-extensions 4.16). Stages are independent; each has its own time limit.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn $R/engine /tmp/p/flotilla/engine && ln -sfn $R/kernels /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p PYTHONUNBUFFERED=1
L=$OUT/sweep.log
for s in ${STAGES:-tests latency latency-sync profile qwen}; do
  echo "=== $s $(date +%T)"
  case $s in
    tests) (cd /tmp && timeout 150 python3 -m pytest $R/tests/engine/test_gpu.py $R/tests/kernels -m gpu -q -x -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -15) ;;
    latency) timeout 260 python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,16,64,256 --contexts 512,4096 --steps 32 --hf-batch-sizes 1 --json $OUT/gpu-latency-llama8b-s2.json 2>&1 | tee -a $L | grep -v "^{" | grep -v INFO | tail -14 ;;
    latency-sync) timeout 90 python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,64 --contexts 512 --steps 32 --no-async-scheduling --json $OUT/gpu-latency-llama8b-s2-sync.json 2>&1 | tee -a $L | grep -v "^{" | grep -v INFO | tail -5 ;;
    profile) timeout 90 python3 bench/decode_profile.py --shape llama-3.1-8b --batch-sizes 1,64 --context 512 --steps 20 --json $OUT/gpu-decode-profile-llama8b-s2.json 2>&1 | tee -a $L | grep -v INFO | grep -v "^ " | tail -4 ;;
    qwen) timeout 80 python3 bench/latency.py --shape qwen3-8b --batch-sizes 1,64 --contexts 512 --steps 32 --json $OUT/gpu-latency-qwen3-8b-s2.json 2>&1 | tee -a $L | grep -v "^{" | grep -v INFO | tail -5 ;;
    throughput) timeout 240 python3 bench/throughput.py --shape llama-3.1-8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-cb --json $OUT/gpu-throughput-llama8b-s2.json 2>&1 | tee -a $L | grep -E "Error|error|output_tokens_per_s|fraction|speedup|bound_s" | tail -10 ;;
    throughput-mixed) timeout 120 python3 bench/throughput.py --shape llama-3.1-8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --mixed --max-num-seqs 512 --max-num-batched-tokens 16384 --json $OUT/gpu-throughput-mixed-llama8b-s2.json 2>&1 | tee -a $L | grep -E "Error|error|output_tokens_per_s|fraction" | tail -6 ;;
    prefix) timeout 90 python3 bench/prefix.py --shape llama-3.1-8b --load-format dummy --num-requests 32 --prefix-len 2000 --suffix-len 20 --output-len 16 --single-engine --max-num-batched-tokens 8192 --json $OUT/gpu-prefix-llama8b-s2.json 2>&1 | tee -a $L | grep -E "Error|error|speedup|ttft_mean|_ttft_s" | tail -10 ;;
    greedy) timeout 150 python3 bench/greedy_match.py --shape llama-3.1-8b --num-prompts 8 --tokens 32 --json $OUT/gpu-greedy-match-llama8b-s2.json 2>&1 | tee -a $L | grep -v "^ " | grep -v INFO | tail -6 ;;
    gemv-kernels) timeout 120 python3 bench/kernels.py --sections gemv --out $OUT/kernels-gemv-s2.json 2>&1 | tee -a $L | grep -iv "info" | tail -12 ;;
    latency-fused) timeout 100 python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,16,64 --contexts 512 --steps 32 --json $OUT/gpu-latency-llama8b-s2-fused.json 2>&1 | tee -a $L | grep -v "^{" | grep -v INFO | tail -5 ;;
    latency-gemv) FLOTILLA_TRITON_GEMV_MAX_ROWS=4 timeout 100 python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,16,64 --contexts 512 --steps 32 --json $OUT/gpu-latency-llama8b-s2-gemv.json 2>&1 | tee -a $L | grep -v "^{" | grep -v INFO | tail -5 ;;
    profile-gemv) FLOTILLA_TRITON_GEMV_MAX_ROWS=4 timeout 90 python3 bench/decode_profile.py --shape llama-3.1-8b --batch-sizes 1 --context 512 --steps 20 --json $OUT/gpu-decode-profile-llama8b-s2-gemv.json 2>&1 | tee -a $L | grep -v INFO | tail -12 ;;
    tests-graphs) (cd /tmp && timeout 90 python3 -m pytest "$R/tests/engine/test_gpu.py" -k "cuda-graphs-async" -q -x -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -3) ;;
  esac
done
echo "=== done $(date +%T)"

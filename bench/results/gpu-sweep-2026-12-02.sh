#!/bin/bash
# The device command behind bench/results/gpu-*-2026-12-02.json: run from the repository root on
# the H200 machine (carry .whl: pydantic 2.14.4, pydantic-core 2.50.5, annotated-types, typing-inspection,
# typing-extensions 4.16). Stages are independent; each has its own time limit.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn $R/engine /tmp/p/flotilla/engine && ln -sfn $R/kernels /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p PYTHONUNBUFFERED=1
STAGES=${STAGES:-tests greedy latency throughput prefix}
for s in $STAGES; do
  echo "=== $s $(date +%T)"
  case $s in
    tests) (cd /tmp && timeout 120 python3 -m pytest $R/tests/engine/test_gpu.py $R/tests/kernels -m gpu -q -x -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -15) ;;
    greedy) timeout 150 python3 bench/greedy_match.py --shape llama-3.1-8b --num-prompts 8 --tokens 32 --json $OUT/gpu-greedy-match-llama8b.json 2>&1 | tee -a $OUT/sweep.log | grep -v "^ " | tail -12 ;;
    latency) timeout ${LAT_T:-260} python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,16,64,256 --contexts ${CTX:-512,4096} --steps 32 ${HF_LAT:---hf-batch-sizes 1} --json $OUT/gpu-latency-llama8b.json 2>&1 | tee -a $OUT/sweep.log | grep -v "^{" | tail -22 ;;
    throughput) timeout 180 python3 bench/throughput.py --shape llama-3.1-8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 ${HF_CB:-} --json $OUT/gpu-throughput-llama8b.json 2>&1 | tee -a $OUT/sweep.log | grep -E "INFO|Error|error|output_tokens_per_s|fraction|speedup|bound_s" | tail -14 ;;
    qwen) timeout 70 python3 bench/latency.py --shape qwen3-8b --batch-sizes 1,64 --contexts 512 --steps 32 --json $OUT/gpu-latency-qwen3-8b.json 2>&1 | tee -a $OUT/sweep.log | grep -v "^{" | tail -8 ;;
    prefix) timeout 75 python3 bench/prefix.py --shape llama-3.1-8b --load-format dummy --num-requests 32 --prefix-len 2000 --suffix-len 20 --output-len 16 --single-engine --max-num-batched-tokens 8192 --json $OUT/gpu-prefix-llama8b.json 2>&1 | tee -a $OUT/sweep.log | grep -E "INFO|Error|error|speedup|ttft_mean|_ttft_s" | tail -14 ;;
    profile) timeout 150 python3 bench/decode_profile.py --shape llama-3.1-8b --batch-sizes 1,64 --context 512 --steps 20 ${PROFILE_ARGS:-} --json $OUT/gpu-decode-profile-llama8b${PROFILE_TAG:-}.json 2>&1 | tee -a $OUT/sweep.log | grep -v "INFO" | tail -30 ;;
  esac
done
echo "=== done $(date +%T)"

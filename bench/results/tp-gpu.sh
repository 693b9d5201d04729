#!/bin/bash
# Issue 20/21: tensor and pipeline parallelism on several H200s (NCCL). NOT RUN YET: written in the
# issue-20 session, which had no GPU time; issue 21 runs it on an nvidia-h200-x4 (or x8) machine.
# Stages:
#   tests   the CPU parallel tests on CUDA (NCCL between workers): tp=2, pp=2 and tp=2 x pp=2 greedy
#           tokens equal HF on the tiny models, the killed-worker test, and the -tp 2 server test
#   tp1     no regression at tp=1: bench/latency.py decode batch 1 and 64 at context 512 on the 8B
#           shape; compare with bench/results/gpu-latency-llama8b-2026-12-03.json (4.58 / 5.91 ms)
#   tp2-8b  offline throughput of the 8B shape at -tp 1 and -tp 2 (1,000 x 512/128, dummy weights)
#   tp2-70b / tp4-70b / pp2-70b   Llama-3.1-70B shape (bf16 ~141 GB): -tp 2, -tp 4, -tp 2 -pp 2
# Run from the repository root on the H200 machine, carrying .whl as for bench/results/gpu-2026-12-03.sh
# (pydantic 2.14.4, pydantic-core 2.50.5 cp312, annotated-types, typing-inspection, typing-extensions,
# and for the server test fastapi 0.165.0, starlette, annotated-doc, anyio, sniffio, idna, uvicorn,
# click, h11, httpx, httpcore, certifi, opentelemetry-api, importlib-metadata, zipp, openai + its deps).
# Each stage has its own limit, cut short by a whole-call deadline so the call ends inside its lease:
#   STAGES="tests tp1 tp2-8b tp2-70b" BUDGET_S=560 bash bench/results/tp-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 560
L=$OUT/tp-gpu.log
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
LOAD="--load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384"
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
python3 $R/bench/model_dirs.py llama-3.1-70b /tmp/llama70b > /dev/null
nvidia-smi topo -m 2>&1 | head -12 | tee -a $L
throughput() {  # name, seconds, model dir, flags...
  local name=$1 limit=$2 model=$3; shift 3
  timeout $(left $limit) python3 $R/bench/throughput.py --model $model $LOAD "$@" --json $OUT/tp-gpu-$name.json \
    2>&1 | grep -E "Error|error|output_tokens_per_s|KV cache" | tail -6 | tee -a $L
}
for s in ${STAGES:-tests tp1 tp2-8b tp2-70b tp4-70b pp2-70b}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left, $GPUS GPUs)" | tee -a $L
  [ $((END - SECONDS)) -lt 30 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    tests) timeout $(left 240) python3 -m pytest $R/tests/engine/test_parallel.py $R/tests/engine/server/test_tensor_parallel_server.py -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -rs 2>&1 | tail -15 | tee -a $L ;;
    tp1) (cd $R && timeout $(left 120) python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,64 --contexts 512 --steps 32 --json $OUT/tp-gpu-latency-tp1.json 2>&1 | grep -v "^{" | grep -v INFO | tail -5 | tee -a $L) ;;
    tp2-8b) throughput 8b-tp1 150 /tmp/llama8b; throughput 8b-tp2 150 /tmp/llama8b -tp 2 ;;
    tp2-70b) throughput 70b-tp2 240 /tmp/llama70b -tp 2 ;;
    tp4-70b) [ $GPUS -ge 4 ] && throughput 70b-tp4 240 /tmp/llama70b -tp 4 || echo "skipped: needs 4 GPUs" | tee -a $L ;;
    pp2-70b) [ $GPUS -ge 4 ] && throughput 70b-tp2-pp2 240 /tmp/llama70b -tp 2 -pp 2 || echo "skipped: needs 4 GPUs" | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

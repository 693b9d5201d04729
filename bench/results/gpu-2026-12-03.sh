#!/bin/bash
# The one H200 call of 2026-12-03: issue 16's "behaviour unchanged" (the gpu-marked tests and the new
# engine tests on CUDA), issue 17.1 on CUDA (bench/gpu_request_bounds.py), a decode-latency regression
# check against call 5 of 2026-12-02 (4.58 / 5.91 ms at batch 1 / 64, context 512), and issue 19's HTTP
# figure (offline vs `flotilla serve`, 1,000 x 512/128, 512 streams, 2 client processes).
# Run from the repository root on the H200 machine, carrying .whl: pydantic 2.14.4, pydantic-core 2.50.5
# (cp312), annotated-types, typing-inspection, typing-extensions 4.16, and the HTTP stack fastapi 0.165.0,
# starlette 1.10.0, annotated-doc, anyio 4.16, sniffio, idna, uvicorn 0.55, click, h11, httpx 0.29,
# httpcore, certifi, opentelemetry-api 1.45.2, importlib-metadata, zipp (all py3-none-any but pydantic-core).
# Each stage has its own limit, cut short by a whole-call deadline so the call ends inside its lease.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$PWD; END=$((SECONDS + ${BUDGET_S:-540}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn $R/engine /tmp/p/flotilla/engine && ln -sfn $R/kernels /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p:$R/bench PYTHONUNBUFFERED=1
L=$OUT/gpu-2026-12-03.log
left() { local l=$((END - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
ENGINE="--max-model-len 4096 --max-num-seqs 512 --max-num-batched-tokens 16384 --load-format dummy"
LOAD="--num-prompts 1000 --input-len 512 --output-len 128 --vocab-size 128256"
cd /tmp  # `python -m flotilla...` from the repository root would import the source flotilla/ (FACTS)
for s in ${STAGES:-tests bounds latency offline serve}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    tests) timeout $(left 200) python3 -m pytest $R/tests/engine/test_gpu.py $R/tests/engine/test_model_runner.py $R/tests/engine/test_forward_context.py $R/tests/kernels -m gpu -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -15 | tee -a $L ;;
    bounds) (cd $R && timeout $(left 60) python3 bench/gpu_request_bounds.py 2>&1 | grep -v INFO | tail -12 | tee -a $L) ;;
    latency) (cd $R && timeout $(left 110) python3 bench/latency.py --shape llama-3.1-8b --batch-sizes 1,64 --contexts 512 --steps 32 --json $OUT/gpu-latency-llama8b-2026-12-03.json 2>&1 | grep -v "^{" | grep -v INFO | tail -5 | tee -a $L) ;;
    offline) python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      timeout $(left 130) python3 $R/bench/throughput.py --model /tmp/llama8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --json $OUT/gpu-http-offline-2026-12-03.json 2>&1 | grep -E "Error|error|output_tokens_per_s" | tail -4 | tee -a $L ;;
    serve) timeout $(left 260) python3 $R/bench/serve.py --launch --model /tmp/llama8b --serve-args "$ENGINE" $LOAD --max-concurrency 512 --clients 2 --warmups 1 --json $OUT/gpu-http-serve-2026-12-03.json 2>&1 | tail -16 | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L
# Run on 2026-12-03 (the session's device time left room for three stages only):
#   STAGES="tests bounds latency" BUDGET_S=230 bash bench/results/gpu-2026-12-03.sh   -> gpu-2026-12-03.log
# and, in a second call on the warm machine, the kernel tests compiled on the GPU:
#   cd /tmp && python3 -m pytest $R/tests/kernels $R/tests/engine/test_model_runner.py \
#     $R/tests/engine/test_forward_context.py -q -x -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R
#   -> gpu-kernel-tests-2026-12-03.log (114 passed). The offline and serve stages were not run.

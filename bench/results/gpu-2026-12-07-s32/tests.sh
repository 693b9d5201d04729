#!/bin/bash
# Session 32 (~3 min): the GPU-marked tests of what this session changed on the GPU path: flags32's
# --compilation-config cudagraph_capture_sizes (engine/cuda_graphs.py StepGraphs sizes; test_gpu.py's new
# test_cuda_compilation_config_capture_sizes_keep_greedy_tokens) beside test_gpu.py's other graph tests, and the
# pooling runner's GPU test (score32's /score and /rerank embed through it). Any card; from the repository root,
# carrying .whl:   OUT=... bash bench/results/gpu-2026-12-07-s32/tests.sh
O=${OUT:-/tmp/out}; mkdir -p $O
source bench/results/gpu-env.sh 240
timeout $(left 235) python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
  --basetemp=/tmp/pt $R/tests/engine/test_gpu.py \
  $R/tests/engine/pooling/test_embed.py > $O/gpu-tests.log 2>&1
echo "rc=$?" >> $O/gpu-tests.log
{ nvidia-smi --query-gpu=name --format=csv,noheader; tail -30 $O/gpu-tests.log; } | tee $O/summary.txt

#!/bin/bash
# Session 21, call 3 (~4 min): session 21's changes on sm_90, none of which has run on a GPU: the GPU-marked tests of the
# kernels kern21 restructured (FLOTILLA_NORM_GEMV removed, `FP8_CACHE` renamed, the int4 split-K fix-up and the bf16
# one-row K loop written once; SASS compared equal on the CPU, not run), the penalty tables kept on the device
# (host21), the engine's GPU tests (graphs, staging after a finished row) and the pooling pass.
# From the repository root, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s21/call3.sh
O=${OUT:-/tmp/out}; R=$PWD; mkdir -p $O
source bench/results/gpu-env.sh 240
timeout $(left 235) python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
  $R/tests/kernels/test_gemv_rope.py $R/tests/kernels/test_gated_gemv.py $R/tests/kernels/test_gemv.py \
  $R/tests/kernels/test_fp8_row_gemv.py $R/tests/kernels/test_int4_fused_forms.py $R/tests/kernels/test_int4_gemv.py \
  $R/tests/kernels/test_int4_gemv_wide.py $R/tests/kernels/test_int4_wide_pdl.py $R/tests/kernels/test_pdl.py \
  $R/tests/kernels/test_hopper_compile.py $R/tests/kernels/test_dispatch.py $R/tests/kernels/test_lm_head_gemv.py \
  $R/tests/engine/test_penalty_counts.py $R/tests/engine/test_gpu.py $R/tests/engine/pooling/test_embed.py \
  > $O/gpu-tests.log 2>&1
echo "rc=$?" >> $O/gpu-tests.log
{ nvidia-smi --query-gpu=name --format=csv,noheader; tail -30 $O/gpu-tests.log; } | tee $O/summary.txt

#!/bin/bash
# Session 20, call 3: main after the merges of delta20 (delta outputs, block-table staging of new ids only), epi20
# (shared rope / SiLU epilogues, norm prologue helpers), sec20 (pooling pass with cache_salt) and head20 (LM head GEMV
# on by default): (1) the GPU-marked tests of every touched kernel and engine path, compiled on sm_90; (2) the HTTP
# serving figure of issue 19 (offline vs `flotilla serve`, 1,000 x 512/128, 512 streams) after delta20's host-path
# change. From the repository root, carrying .whl (pydantic + HTTP stacks, bench/results/http-speed-gpu.sh):
#   OUT=... bash bench/results/gpu-2026-12-05-s20/call3.sh
O=${OUT:-/tmp/out}; R=$PWD; mkdir -p $O/tests $O/http
(
  source bench/results/gpu-env.sh 190
  timeout $(left 185) python3 -m pytest -m gpu -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
    $R/tests/kernels/test_gemv_rope.py $R/tests/kernels/test_gated_gemv.py $R/tests/kernels/test_fp8_row_gemv.py \
    $R/tests/kernels/test_int4_fused_forms.py $R/tests/kernels/test_norm_prologue.py \
    $R/tests/kernels/test_hopper_compile.py $R/tests/kernels/test_activation.py $R/tests/kernels/test_skinny_gemm.py \
    $R/tests/kernels/test_int4_gemv_wide.py $R/tests/kernels/test_int4_wide_pdl.py $R/tests/kernels/test_lm_head_gemv.py \
    $R/tests/engine/test_gpu.py $R/tests/engine/lora/test_lora_graphs.py $R/tests/engine/pooling/test_embed.py \
    > $O/tests/gpu-tests.log 2>&1
  echo "rc=$?" >> $O/tests/gpu-tests.log
)
cd $R && OUT=$O/http BUDGET_S=390 STAGES="offline serve-on" bash bench/results/http6-gpu.sh > $O/http.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; echo "=== tests"; tail -25 $O/tests/gpu-tests.log
  echo "=== http"; head -30 $O/http/*.log; } > $O/summary.txt
cd $O && tar czf call3.tgz tests http http.stdout && rm -rf tests http http.stdout
cat $O/summary.txt

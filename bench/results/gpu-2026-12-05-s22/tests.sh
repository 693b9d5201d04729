#!/bin/bash
# Session 22 (~5 min; up to 7 allowed since shut23's tests): the GPU-marked tests of sessions 21-22's changes on sm_90, none of which has run on a GPU:
# session 21's call3.sh list (kern21's restructured kernels, host21's device penalty tables, the engine's graph /
# staging tests, pooling) plus rev22's kernel folds (paged decode `_tile_t`, the wide int4 `_plane_pair`; SASS
# compared equal on the CPU) and srv22's penalty tables reserved in the KV sizing (test_penalty_counts -k cuda);
# session 23 (gpu23) added the per-engine memory budget and the freeing of a shut-down engine (test_memory_profile);
# shut23 added, in the same file, the draft model's charge and the CUDA graphs' charge at 0.9.
# From the repository root, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s22/tests.sh
O=${OUT:-/tmp/out}; R=$PWD; mkdir -p $O
source bench/results/gpu-env.sh 420
timeout $(left 415) python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
  $R/tests/engine/test_penalty_counts.py $R/tests/kernels/test_paged_decode.py $R/tests/kernels/test_paged_prefill.py \
  $R/tests/kernels/test_fp8_kv_cache.py $R/tests/kernels/test_mixed_attention.py \
  $R/tests/kernels/test_gemv_rope.py $R/tests/kernels/test_gated_gemv.py $R/tests/kernels/test_gemv.py \
  $R/tests/kernels/test_fp8_row_gemv.py $R/tests/kernels/test_int4_fused_forms.py $R/tests/kernels/test_int4_gemv.py \
  $R/tests/kernels/test_int4_gemv_wide.py $R/tests/kernels/test_int4_wide_pdl.py $R/tests/kernels/test_pdl.py \
  $R/tests/kernels/test_hopper_compile.py $R/tests/kernels/test_dispatch.py $R/tests/kernels/test_lm_head_gemv.py \
  $R/tests/engine/test_gpu.py $R/tests/engine/pooling/test_embed.py $R/tests/engine/test_memory_profile.py \
  > $O/gpu-tests.log 2>&1
echo "rc=$?" >> $O/gpu-tests.log
{ nvidia-smi --query-gpu=name --format=csv,noheader; tail -30 $O/gpu-tests.log; } | tee $O/summary.txt

#!/bin/bash
# Issue 19's CPU row on a quiet 2-core machine: Flotilla vs llama.cpp's server (llama-cpp-python 0.3.36 in its own
# venv, built from PyPI: `python3 -m venv /work/llama-venv && /work/llama-venv/bin/pip install
# 'llama-cpp-python[server]==0.3.36'`), the embedded model, 3 rounds each, in the configurations session 9 measured:
#   fp32          --dtype float32 (faster than bf16 only on CPUs without native bf16, e.g. session 7's AVX2-only
#                 machine; session 9's has avx512_bf16, where bf16 matmuls are 3-6x faster than fp32)
#   bf16-rtn4g32  --quantization rtn, RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 (4-bit weights as llama.cpp's Q4_1,
#                 through torch's packed int4 CPU kernel, bf16 activations)
# Usage, from the repository root after `make setup`: LLAMA_PY=/work/llama-venv/bin/python bash bench/results/cpu9-quiet.sh
set -eu
OUT=${OUT:-bench/results/cpu-$(date +%F)-quiet}
PY=.venv/bin/python; LLAMA_PY=${LLAMA_PY:-/work/llama-venv/bin/python}
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds 3 --flotilla-args '--quantization rtn' \
  --flotilla-env RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 --out $OUT/bf16-rtn4g32 | tee $OUT-bf16-rtn4g32.log
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds 3 --flotilla-args '--dtype float32' --out $OUT/fp32 \
  | tee $OUT-fp32.log

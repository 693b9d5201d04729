#!/bin/bash
# Issue 19's CPU row with the same weights on both sides: Flotilla serving the embedded model's own Q4_1 GGUF codes
# (`--quantization gguf`: torch's int4 CPU kernel, bf16 activations) against llama.cpp's server on the same GGUF
# (llama-cpp-python 0.3.36 in its own venv, built from PyPI: `python3 -m venv /work/llama-venv &&
# CMAKE_BUILD_PARALLEL_LEVEL=1 /work/llama-venv/bin/pip install 'llama-cpp-python[server]==0.3.36'`), 2 threads
# each, 3 rounds, 210 in / 128 out, single stream and 8 streams (bench/cpu_peer.py, as bench/results/cpu9-quiet.sh).
# Usage, from the repository root after `make setup`: LLAMA_PY=/work/llama-venv/bin/python bash bench/results/cpu10-quiet.sh
set -eu
OUT=${OUT:-bench/results/cpu-$(date +%F)-s10-quiet}
PY=.venv/bin/python; LLAMA_PY=${LLAMA_PY:-/work/llama-venv/bin/python}
mkdir -p "$OUT"
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds 3 --flotilla-args '--quantization gguf' \
  --out $OUT/gguf | tee $OUT/gguf.log

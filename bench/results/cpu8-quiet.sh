#!/bin/bash
# cpu8 (session 9): issue 19's CPU row with `--dtype auto` resolving per CPU (engine/config.py cpu_native_bf16:
# an unquantized bf16 model runs in float32 where /proc/cpuinfo lists no avx512_bf16/amx_bf16/bf16), against
# llama.cpp's server (llama-cpp-python 0.3.36, the shipped Q4_1 GGUF, 2 threads), 3 rounds each:
#   auto          no flags: float32 on an AVX2-only host, bf16 on one with native bf16 (the flags are logged)
#   bf16-rtn4g32  --quantization rtn, RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 (stays bf16: the int4 CPU kernel's input)
# Usage, from the repository root after `make setup`: LLAMA_PY=/work/llama-venv/bin/python bash bench/results/cpu8-quiet.sh
set -eu
OUT=${OUT:-bench/results/cpu-2026-12-04-s9/cpu8}
PY=.venv/bin/python; LLAMA_PY=${LLAMA_PY:-/work/llama-venv/bin/python}
mkdir -p "$OUT"
grep -m1 -oE 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu-bf16-flags.txt" || true
echo "native bf16 flags: $(cat "$OUT/cpu-bf16-flags.txt") (empty: --dtype auto -> float32)"
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds 3 --out "$OUT/auto" | tee "$OUT-auto.log"
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds 3 --flotilla-args '--quantization rtn' \
  --flotilla-env RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 --out "$OUT/bf16-rtn4g32" | tee "$OUT-bf16-rtn4g32.log"

#!/bin/bash
# Session 10: the embedded model's own Q4_1 codes (`--quantization gguf`) against RTN 4-bit groups of 32 (session 9's
# CPU configuration) and the bf16 model, on the shared 2-core CPU, every process with OMP_NUM_THREADS=1 (this session's
# rule for a machine shared by ~5 agents; session 9's llama.cpp comparison ran torch on both cores). llama.cpp is
# not installed this session: cpu_peer.py's peer is a second Flotilla (RTN), and llama.cpp's figures are session 9's.
# Usage, from the repository root after `make setup`: bash bench/results/cpu10-gguf.sh
set -eu
OUT=${OUT:-bench/results/cpu-$(date +%F)-s10-gguf}
PY=.venv/bin/python
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
# torch's int4 CPU kernel by activation dtype (the embedded model's 30 layers of matmuls) and the weights' rounding
$PY bench/cpu_int4_dtype.py --threads 1 --repeats 10 --json "$OUT/int4-dtype-t1.json"
# fidelity against the bf16 model: in bf16 (served) with RTN beside it, and in fp32 (the weights alone)
$PY bench/quant_fidelity.py --dtype bfloat16 --variants 'GGUF Q4_1 codes,RTN W4 g32' --json "$OUT/quant-fidelity-bf16.json"
$PY bench/quant_fidelity.py --dtype float32 --variants 'GGUF Q4_1 codes' --json "$OUT/quant-fidelity-fp32.json"
# serving, 210 in / 128 out, single stream and 8 streams, 3 rounds alternating: gguf against RTN 4-bit g32
$PY bench/cpu_peer.py --rounds 3 --flotilla-args '--quantization gguf' --peer-name rtn4g32 \
  --peer-flotilla-args '--quantization rtn' --peer-flotilla-env RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 \
  --out "$OUT/gguf-vs-rtn" | tee "$OUT/gguf-vs-rtn.log"
# decode step in one process, interleaved, 5 rounds: gguf, RTN, bf16 at 1 and 8 rows
RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 $PY bench/cpu_quant_ab.py --configs gguf,rtn4g32,bf16 --json "$OUT/quant-ab.json" \
  | tee "$OUT/quant-ab.log"

#!/bin/bash
# Issue 19's CPU row, session 11: bench/results/cpu10-quiet.sh with the thread counts written down on both sides.
# Flotilla `--quantization gguf` (the embedded model's own Q4_1 GGUF: torch's int4 CPU kernel for the linears and,
# since session 11, the Q8_0 LM head as 8-bit codes; the per-step CPU memo) against llama.cpp's server on the same
# GGUF (llama-cpp-python 0.3.36, /work/llama-venv), each on THREADS threads (default 1): llama.cpp's --n_threads,
# Flotilla's torch through OMP_NUM_THREADS in its own environment. Why 1 by default: on this 2-core machine shared
# by other agents (load average 5-8), both runtimes stall at every barrier of a 2-thread step while the other core
# is taken: torch's one-row step ran ~9x slower on 2 threads than on 1 (611 vs 68 ms, one process, load ~7), and
# llama.cpp's server on 2 threads decoded at 480-1,079 ms a token in the same hour (its own log). THREADS=2 is the
# quiet-machine comparison (sessions 9/10). FLOTILLA_ENV adds KEY=VALUE pairs (e.g. OMP_WAIT_POLICY=PASSIVE). 210 in / 128 out, single stream and 8 streams
# (bench/cpu_peer.py). Usage, from the repository root after `make setup`:
#   LLAMA_PY=/work/llama-venv/bin/python ROUNDS=3 bash bench/results/cpu11-quiet.sh
set -eu
OUT=${OUT:-bench/results/cpu-$(date +%F)-s11}
NAME=${NAME:-gguf-t${THREADS:-1}}
PY=.venv/bin/python; LLAMA_PY=${LLAMA_PY:-/work/llama-venv/bin/python}
mkdir -p "$OUT"
uptime | tee "$OUT/$NAME.log"
# shellcheck disable=SC2086  # FLOTILLA_ENV: several KEY=VALUE words
$PY bench/cpu_peer.py --llama-python "$LLAMA_PY" --rounds "${ROUNDS:-3}" --threads "${THREADS:-1}" \
  --flotilla-args '--quantization gguf' --flotilla-env OMP_NUM_THREADS="${THREADS:-1}" ${FLOTILLA_ENV:-} --out "$OUT/$NAME" 2>&1 | tee -a "$OUT/$NAME.log"
uptime | tee -a "$OUT/$NAME.log"

#!/usr/bin/env bash
# The CPU figures of the README and the closing notes, in one run on the embedded model.
#   bash bench/cpu_suite.sh [OUTDIR]     (default bench/results/cpu-$(date +%F))
# Run it on an otherwise idle machine: every figure shares the 2 cores with nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/cpu-$(date +%F)}
mkdir -p "$out"
py=.venv/bin/python
# Offline: a batch of 16 prompts, Flotilla vs HF transformers generate (same weights, dtype, prompts).
$py bench/throughput.py --num-prompts 16 --input-len 128 --output-len 64 --hf --json "$out/throughput-16.json"
# Prefix caching: 64 concurrent requests with / without a shared 200-token system prompt.
$py bench/prefix.py --num-requests 64 --prefix-len 200 --suffix-len 20 --output-len 32 --json "$out/prefix-64.json"
# Serving: the floor workload (8 streams at once, ~210-token prompts, 128 tokens, ignore_eos, greedy).
$py bench/serve.py --launch --num-prompts 8 --max-concurrency 8 --input-len 210 --range-ratio 0.05 \
  --output-len 128 --json "$out/serve-8x210x128.json"
# Serving at concurrency 1, 8 and 32.
for c in 1 8 32; do
  $py bench/serve.py --launch --num-prompts $((c * 4 > 8 ? c * 4 : 8)) --max-concurrency "$c" --input-len 210 \
    --output-len 64 --json "$out/serve-c$c.json"
done
# The engine loop's thread vs offline vs HTTP.
$py bench/loop_overhead.py --json "$out/loop-overhead.json"
# Side by side with llama.cpp's server (llama-cpp-python in its own venv, never the project's:
#   python3 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install 'llama-cpp-python[server]==0.3.36'
# builds llama.cpp from source, 16 CPU-minutes), when LLAMA_PYTHON names that venv's python.
if [ -n "${LLAMA_PYTHON:-}" ]; then
  $py bench/cpu_peer.py --llama-python "$LLAMA_PYTHON" --rounds 3 --flotilla-args '--dtype float32' --out "$out/peer-fp32"
  $py bench/cpu_peer.py --llama-python "$LLAMA_PYTHON" --rounds 3 --out "$out/peer-bf16"
fi

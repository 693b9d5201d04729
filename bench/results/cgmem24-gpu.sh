#!/bin/bash
# Session 24, helper cgmem: the CUDA-graph memory estimate (engine/memory_profile.py `graph_estimate`) against what
# the real capture takes, Llama-3.1-8B shape with random bf16 weights, one engine a process (bench/graph_memory.py:
# one summary line each: graphs, estimate vs captured GiB, what session 23's rule would have charged from the same
# first two samples, the KV blocks under each, the samples' costs and outputs; then, --per-graph, every graph captured
# again one at a time into a pool of its own: where the memory goes, the graphs that took most beyond their outputs,
# and the estimate from that curve's samples). Stages (STAGES, in this order):
#   offline  bench/throughput.py's engine: --max-model-len 656 (512 in + 128 out) --max-num-seqs 512
#            --max-num-batched-tokens 16384: 31 graphs (session 23 on an H100: 0.64 GiB estimated from [172, 16] MiB)
#   server   `flotilla serve` as bench/results/http6-gpu.sh's serve-on runs it: --max-model-len 4096 --max-num-seqs 512
#            --max-num-batched-tokens 16384 --max-cudagraph-capture-size 4096: 110 graphs (session 23: 12.53 GiB
#            estimated from [618, 112] MiB, 40.65 GiB of KV against the offline run's 52.63)
#   tests    tests/engine/test_memory_profile.py's GPU tests of the graphs (the 0.9 budget: the capture, with what the
#            profile's captures left held, within the estimate + 16 MiB, and the estimate within 2x that + 128 MiB;
#            pools and graphs given back): expect
#            0 failed (TESTS=all: every GPU test of the file, ~60 s)
# Budget: BUDGET_S, default 200 s (each engine ~40-55 s: load, profile with its sampled captures, the real capture,
# the per-graph curve).
# Run from the repository root carrying .whl (the pydantic stack), as the other scripts:
#   OUT=... bash bench/results/cgmem24-gpu.sh
# $OUT: cgmem24.log (the GPU, each stage's rc and summary line; read first), offline/server.json and .out (the full
# engine logs: "CUDA graph memory" lines), tests.out.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/cgmem24.log
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $L 2>&1
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
ENGINE="--model /tmp/llama8b --max-num-seqs 512 --max-num-batched-tokens 16384"
PAT="graphs, estimate|per graph:|CUDA graph memory"
K=$([ "${TESTS:-}" = all ] && echo "cuda" || echo "0_9_budget or pool_and_graphs")
for s in ${STAGES:-offline server tests}; do
  case $s in
    offline) run_stage offline 50 "$PAT" python3 $R/bench/graph_memory.py $ENGINE --name offline \
               --max-model-len 656 --per-graph --json $OUT/offline.json ;;
    server)  run_stage server 65 "$PAT" python3 $R/bench/graph_memory.py $ENGINE --name server \
               --max-model-len 4096 --max-cudagraph-capture-size 4096 --per-graph --json $OUT/server.json ;;
    tests)   run_stage tests 70 "passed|failed|FAILED|skipped" python3 -m pytest -p no:cacheprovider \
               -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt $R/tests/engine/test_memory_profile.py \
               -m gpu -k "$K" ;;
  esac
done
echo "=== summary" | tee -a $L
grep -h "graphs, estimate\|per graph:" $OUT/offline.out $OUT/server.out 2>/dev/null | tee -a $L

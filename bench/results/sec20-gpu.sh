#!/bin/bash
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 120
# Session 20, branch sec20: the pooling pass now takes a cached prefix (keyed with the request's cache_salt) and
# feeds only the rest, so on the GPU its prefill is an extend over cached K/V (engine/pooling/embed.py). One call,
# ~60 s: the GPU-marked pooling test (embeddings of prompts sharing a 112-token prefix, hits within one call, across
# calls and under a new salt, equal to HF's; the last prompt's new positions straddle the prefill kernel's key-split
# boundary at 128), then the generate path's cached-prefix GPU test as a control. Output: $OUT/sec20.log.
# Run from the repository root on the GPU machine, carrying .whl (pydantic stack) as the other scripts:
#   BUDGET_S=120 bash bench/results/sec20-gpu.sh
L=$OUT/sec20.log
echo "=== pooling $(date +%T)" | tee -a $L
timeout $(left 80) python3 -m pytest $R/tests/engine/pooling/test_embed.py -m gpu -q -p no:cacheprovider \
  -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -15 | tee -a $L
echo "=== generate control $(date +%T)" | tee -a $L
timeout $(left 40) python3 -m pytest $R/tests/engine/test_gpu.py -m gpu -k cached_prefix -q -p no:cacheprovider \
  -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -6 | tee -a $L

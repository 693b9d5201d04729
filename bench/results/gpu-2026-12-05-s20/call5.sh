#!/bin/bash
# Session 20, call 5 (the budget's last ~260 s): the LoRA GPU tests call 4 did not reach, each in its own pytest
# process (call 3 ran them after 28 other GPU tests in one process: 3 failed at once; call 4 ran the first alone: it
# passed, with the LM head on the GEMV and on cuBLAS). From the repository root, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-05-s20/call5.sh
source bench/results/gpu-env.sh 240
F=$R/tests/engine/lora/test_lora_graphs.py
T="python3 -m pytest -m gpu -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rfE --tb=short"
for t in "test_cuda_new_lora_kernels_give_the_per_token_pairs_tokens:120" "test_cuda_lora_on_rtn4_layers:110"; do
  timeout $(left ${t#*:}) $T "$F::${t%:*}" > $OUT/${t%:*}.log 2>&1; echo "rc=$?" >> $OUT/${t%:*}.log
  tail -5 $OUT/${t%:*}.log
done

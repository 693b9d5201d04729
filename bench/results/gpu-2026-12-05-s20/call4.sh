#!/bin/bash
# Session 20, call 4: (1) call 3's GPU tests stopped at tests/engine/lora/test_lora_graphs.py (3 failures, then the
# 185 s limit): run that file alone with tracebacks, then its first test again with the LM head on cuBLAS
# (FLOTILLA_LM_HEAD_GEMV=0) to tell whether session 20's head change is the cause, then the pooling GPU test that
# call 3 never reached; (2) tile20's in-engine int4 tile sweep (bench/results/tile20-gpu.sh).
# From the repository root, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s20/call4.sh
O=${OUT:-/tmp/out}; R=$PWD; mkdir -p $O/tests $O/tile
(
  source bench/results/gpu-env.sh 170
  T="python3 -m pytest -m gpu -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rfE --tb=short"
  timeout $(left 75) $T -x $R/tests/engine/lora/test_lora_graphs.py > $O/tests/lora.log 2>&1; echo "rc=$?" >> $O/tests/lora.log
  FLOTILLA_LM_HEAD_GEMV=0 timeout $(left 40) $T -x "$R/tests/engine/lora/test_lora_graphs.py::test_cuda_graph_lora_tokens_equal_eager" \
    > $O/tests/lora-cublas-head.log 2>&1; echo "rc=$?" >> $O/tests/lora-cublas-head.log
  timeout $(left 50) $T $R/tests/engine/pooling/test_embed.py > $O/tests/pooling.log 2>&1; echo "rc=$?" >> $O/tests/pooling.log
)
cd $R && OUT=$O/tile BUDGET_S=240 bash bench/results/tile20-gpu.sh > $O/tile.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; for f in lora lora-cublas-head pooling; do echo "=== $f";
  grep -E "passed|failed|rc=|Error|error|assert" $O/tests/$f.log | head -12; done
  echo "=== tile"; head -30 $O/tile/tile20.log; } > $O/summary.txt
cd $O && tar czf call4.tgz tests tile tile.stdout && rm -rf tests tile tile.stdout
cat $O/summary.txt

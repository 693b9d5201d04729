#!/bin/bash
# Session 11, helper op11b: LoRA on a quantized base model whose layers hold packed codes (rtn 4-bit here) on the
# H200, one call of <= 200 s (BUDGET_S). The lead's command, from the repository root, carrying .whl:
#   BUDGET_S=200 bash bench/results/op11b-gpu.sh
# Stages (each under its own limit inside the whole-call deadline):
#   lora-rtn4 (180 s) tests/engine/lora/test_lora_graphs.py -k rtn4: tiny Llama, RTN_NUM_BITS=4 groups of 32, two
#             adapters and the base model in one batch; in fp32 and bf16 (bf16: the Triton int4 kernels) the greedy
#             tokens of the captured LoRA graphs equal the eager path's and the adapters change tokens; in fp32 they
#             equal the CPU engine's. Four CUDA engines (Triton compiles, graph capture twice each: ~20-40 s each).
#             Expect "2 passed, 6 deselected". Before this branch every such start-up failed with AttributeError
#             'QKVParallelLinear' object has no attribute 'weight'.
#   summary   the pytest tail again (always runs).
# Output: $OUT/op11b.log (read it first), $OUT/op11b-pytest.log (the whole pytest output).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/op11b.log
PYTEST="python3 -m pytest -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R"
for s in ${STAGES:-lora-rtn4 summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 30 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    lora-rtn4) timeout $(left 180) $PYTEST $R/tests/engine/lora/test_lora_graphs.py -k rtn4 -rs --durations=4 \
        > $OUT/op11b-pytest.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "passed|failed|error|Error|assert" $OUT/op11b-pytest.log | cut -c1-400 | tail -20 | tee -a $L ;;
    summary) tail -8 $OUT/op11b-pytest.log 2>/dev/null | cut -c1-400 | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

#!/bin/bash
# Session 22, helper mixattn22: a large mixed step's attention as two launches (FLOTILLA_MIXED_DECODE_SPLIT,
# kernels/mixed_attention.py: decode rows through the decode kernel, prompts through the prefill kernel) and the
# prompt launch's knobs (FLOTILLA_PREFILL_LAUNCH=block_m,block_n,warps,stages). Issue 19's offline step: 448 decode
# rows at context ~576 + 31 prompts of 512 tokens, Llama-3.1-8B; `_prefill_kernel` was 35.5 ms of a 361-375 ms step
# (bench/results/gpu-2026-12-05-s22/call1/mixed/mixed.log, H100).
# Stages (STAGES, in this order, each under its own limit inside BUDGET_S, default 300 s; rc=124: cut):
#   kernel  bench/mixed_attention.py at the step's shape: one launch / split / its decode and prefill halves (us a
#           layer and x32 ms), then the prompt-launch sweep (block_m 128/64 x block_n 32/64/128 x warps 4/8 x
#           stages 3/2, each split output checked against the one launch): SWEEP lines, one BEST line;
#   off     bench/mixed_step_profile.py --steps 2 --enforce-eager, switch off (the before);
#   on      the same with FLOTILLA_MIXED_DECODE_SPLIT=1 (compare "busy" and "attention" in the step lines);
#   tests   the CPU tests compiled + the gpu-marked ones: tests/kernels/test_mixed_attention.py (expect 13 passed)
#           and tests/engine/test_gpu.py's mixed_decode_split test (expect 2 passed: graphs and eager, CPU tokens);
#   best    on + FLOTILLA_PREFILL_LAUNCH = the kernel stage's BEST (skipped without one, or when it is the default);
#   regress the decode/prefill/fp8 kernel tests (the decode kernel and merge now skip sequences of != 1 token).
# $OUT: mixattn22.log (read first: GPU, each stage's rc and key lines), kernel.json, off/on/best.json.
# Run from the repository root carrying .whl (the pydantic stack), as the other scripts:
#   OUT=... bash bench/results/mixattn22-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 300
L=$OUT/mixattn22.log
B=$R/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
PYTEST="python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt"
PROFILE="$B/mixed_step_profile.py --decode-rows 448 --prompts 31 --prompt-len 512 --steps 2 --enforce-eager"
for s in ${STAGES:-kernel off on tests best regress}; do
  case $s in
    kernel) run_stage kernel 100 "us a layer|rel_err|^SWEEP|^BEST" python3 $B/mixed_attention.py --json $OUT/kernel.json ;;
    tests) run_stage tests 60 "passed|failed|skipped|FAILED|assert" $PYTEST $R/tests/kernels/test_mixed_attention.py \
             "$R/tests/engine/test_gpu.py::test_cuda_mixed_decode_split_keeps_greedy_tokens" ;;
    off) run_stage off 55 "^step of|_kernel" env FLOTILLA_MIXED_DECODE_SPLIT=0 python3 $PROFILE --json $OUT/off.json ;;
    on) run_stage on 55 "^step of|_kernel" env FLOTILLA_MIXED_DECODE_SPLIT=1 python3 $PROFILE --json $OUT/on.json ;;
    best) BEST=$(python3 -c "import json; b = json.load(open('$OUT/kernel.json')).get('best'); print(b['env'] if b else '')" 2>/dev/null)
          if [ -z "$BEST" ] || [ "$BEST" = "128,32,4,3" ]; then echo "=== best: skipped (BEST '$BEST')" | tee -a $L
          else echo "FLOTILLA_PREFILL_LAUNCH=$BEST" | tee -a $L
            run_stage best 50 "^step of|_kernel" env FLOTILLA_MIXED_DECODE_SPLIT=1 FLOTILLA_PREFILL_LAUNCH=$BEST \
              python3 $PROFILE --json $OUT/best.json; fi ;;
    regress) run_stage regress 90 "passed|failed|FAILED" $PYTEST -x $R/tests/kernels/test_paged_decode.py \
               $R/tests/kernels/test_paged_prefill.py $R/tests/kernels/test_fp8_kv_cache.py ;;
  esac
done
echo "=== done $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L

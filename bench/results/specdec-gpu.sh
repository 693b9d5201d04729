#!/bin/bash
# Issue 27 on the H200. Speculative decoding's mechanism cost, Llama-3.1-8B shape with random bf16
# weights, k = 4: a benchmark-only proposer that is always right (its drafts are accepted by a forced-
# acceptance hook, see bench/spec_decode.py) and one that is always wrong, against no speculation, in
# one engine per batch size, each proposer after an untimed warm-up wave. Targets: batch 1 >= 3.0x
# output tok/s when always right, <= 10 % slower when always wrong; batch 64 with
# disable_by_batch_size 32 within 3 % of no speculation. Run of 2026-12-03 before the fixes:
# specdec-gpu-2026-12-03-before.* (about 55 s of the budget).
# Stage `phases` (bench/spec_step_overhead.py, batch 1): per step, the host's phases, the host's work
# while the device has nothing queued (idle_host_ms_per_step) and the wait for the device, per mode:
# step(oracle-wrong) - step(none) = that idle time + the verify pass's extra device time; with
# --kernel-profile one more request per mode under torch.profiler gives that device time by kernel
# (`kernels_us_per_step`, `gpu_busy_us_per_step` in $OUT/specdec-gpu-llama8b-phases.json).
# Run from the repository root on the H200 machine, carrying .whl with pydantic 2.14.4, pydantic-core
# 2.50.5 (cp312), annotated-types, typing-inspection, typing-extensions (see gpu-2026-12-03.sh).
#   BUDGET_S=200 bash bench/results/specdec-gpu.sh   -> $OUT/specdec-gpu.log and the JSON files
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/specdec-gpu.log
COMMON="--model /tmp/llama8b --load-format dummy --workload random --input-len 512 --max-tokens 128 --max-model-len 4096 --k 4"
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
for s in ${STAGES:-tests b1 phases b64}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    # The rejection sampler and the lookup on CUDA tensors (the engine tests need the embedded model,
    # which is too large to carry).
    tests) timeout $(left 60) python3 -m pytest $R/tests/engine/spec_decode/test_rejection_sampler.py $R/tests/engine/spec_decode/test_ngram_proposer.py $R/tests/engine/spec_decode/test_decode_rows.py -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -5 | tee -a $L ;;
    b1) timeout $(left 90) python3 $R/bench/spec_decode.py $COMMON --batch 1 --num-prompts 4 --proposers none,oracle-right,oracle-wrong --json $OUT/specdec-gpu-llama8b-b1.json 2>&1 | grep -E "^(none|oracle)|Error|error" | tee -a $L ;;
    # Where a speculating step's time goes against a plain decode step (batch 1, k = 4): host phases,
    # the host's work while the device idles between steps, and the wait for the device.
    phases) timeout $(left 80) python3 $R/bench/spec_step_overhead.py --model /tmp/llama8b --device cuda --input-len 512 --max-tokens 128 --requests 2 --kernel-profile --json $OUT/specdec-gpu-llama8b-phases.json 2>&1 | grep -E "^(none|oracle)|Error|error" | tee -a $L ;;
    b64) timeout $(left 90) python3 $R/bench/spec_decode.py $COMMON --batch 64 --num-prompts 64 --disable-by-batch-size 32 --proposers none,oracle-right,oracle-wrong --json $OUT/specdec-gpu-llama8b-b64.json 2>&1 | grep -E "^(none|oracle)|Error|error" | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

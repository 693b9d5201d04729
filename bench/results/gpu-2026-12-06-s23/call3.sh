#!/bin/bash
# Session 23, one call (<= 9.5 min) validating what the session merged, on whatever card comes:
#   1. pf23's prefill kernel (lean key loop + dead-last tile map, now the defaults): the kernel variants at the
#      offline step's prompt half and a 2,000-token prompt, then its GPU tests (pf23-gpu.sh STAGES="kernel tests");
#   2. the offline run 1,000 x (512 in / 128 out) with pf23's defaults off, then on (offline-ab.sh's settings);
#   3. gpu23's tests: the per-engine memory budget (test_memory_profile), the penalty tables' cuda variants on a tiny
#      model, the test_embed case that failed in call 1, the engine tests that free their engines;
#   4. roof23: the card's measured peaks and the bf16 bs1 ctx 512 step against both rooflines.
# From the repository root of main, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-06-s23/call3.sh
cd "$(dirname "$0")/../../.." || exit 1
O=${OUT:-/tmp/out}; mkdir -p $O/pf23 $O/tests $O/roof
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/summary.txt
( OUT=$O/pf23 BUDGET_S=200 STAGES="kernel tests" bash bench/results/pf23-gpu.sh ) > $O/pf23/stdout.txt 2>&1
( OUT=$O; source bench/results/gpu-env.sh 140; L=$OUT/offline.log
  python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
  for s in 0 1; do
    echo "=== lean/dead_last=$s $(date +%T) ($((END - SECONDS)) s left)" >> $L
    FLOTILLA_PREFILL_LEAN=$s FLOTILLA_PREFILL_DEAD_LAST=$s timeout $(left 75) python3 $R/bench/throughput.py \
      --model /tmp/llama8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 \
      --max-num-batched-tokens 16384 --json $OUT/offline-pf$s.json > /tmp/off$s.out 2>&1
    echo "rc=$?" >> $L; grep -E "Traceback|Error" /tmp/off$s.out | tail -3 >> $L
    python3 -c "import json; d=json.load(open('$OUT/offline-pf$s.json')); f=d['flotilla']; print('output tok/s', round(f['output_tokens_per_s']), 's', round(f['seconds'], 3), 'steps', f['num_steps'], 'fraction_of_bound', round(d['fraction_of_bound'], 4), 'fraction_of_serial', round(d['fraction_of_serial'], 4), 'card', d.get('fraction_of_bound_card'), d.get('fraction_of_serial_card'))" >> $L 2>&1
  done ) > /dev/null 2>&1
( OUT=$O/tests; source bench/results/gpu-env.sh 120
  timeout $(left 115) python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R \
    $R/tests/engine/test_memory_profile.py $R/tests/engine/test_penalty_counts.py \
    "$R/tests/engine/pooling/test_embed.py" "$R/tests/engine/test_gpu.py" > $OUT/gpu-tests.log 2>&1
  echo "rc=$?" >> $OUT/gpu-tests.log ) > /dev/null 2>&1
( OUT=$O/roof BUDGET_S=75 STAGES=decode bash bench/results/roof23-gpu.sh ) > $O/roof/stdout.txt 2>&1
{ grep -v "^$" $O/pf23/pf23.log | tail -40; cat $O/offline.log; tail -4 $O/tests/gpu-tests.log; cat $O/roof/roof23.log; } >> $O/summary.txt
cat $O/summary.txt

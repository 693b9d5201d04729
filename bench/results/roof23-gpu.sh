#!/bin/bash
# Session 23, helper roof23: rooflines at the card that ran. bench/card_peaks.py measures the card's peaks in the
# benchmark's own process before the engine starts (a 1 GiB bf16 device-to-device copy, read + written, as
# bench/kernels.py measured the H200's 4.28 TB/s; an 8,192^3 bf16 matmul; each the best of 10 timings), and
# bench/latency.py reports each step against the H200's peaks (`roofline_ms`, `x_roofline`: the issues' floors) and
# against the card's (`roofline_ms_card`, `x_roofline_card`). Stages (BUDGET_S, default 120 s; each under its limit):
#   decode  bench/latency.py, Llama-3.1-8B shape, random weights, bf16, batch 1 x context 512, 32 steps (~60-80 s:
#           start-up, one batch size's CUDA graphs): the card's copy bandwidth and GEMM rate, and the step with both
#           ratios (on an H100 HBM3, 3.35 TB/s on paper, expect a copy under that and the card's roofline ~4.5-5 ms
#           against the H200's 3.52);
#   tests   tests/test_bench_card_peaks.py on the GPU but the latency.py run (the CUDA measurement's test runs; the
#           CPU-only one skips).
# $OUT: roof23.log (read first: the CARD, DECODE and tests lines), roof23-latency.json (the whole latency JSON).
# Run from the repository root carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/roof23-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 120
L=$OUT/roof23.log
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $L
for s in ${STAGES:-decode tests}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 10 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    decode) timeout $(left 100) python3 $R/bench/latency.py --shape llama-3.1-8b --batch-sizes 1 --contexts 512 \
              --steps 32 --json $OUT/roof23-latency.json > /tmp/roof23-latency.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "Traceback|Error" /tmp/roof23-latency.log | tail -4 | cut -c1-300 | tee -a $L
      python3 - "$OUT/roof23-latency.json" <<'PY' 2>&1 | tee -a $L
import json, sys
r = json.load(open(sys.argv[1]))
card, h200 = r["peaks"]["card"], r["peaks"]["h200"]
if "skipped" in card:
    print(f"CARD not measured: {card['skipped']}")
else:
    print(f"CARD {card['device']}: copy {card['copy_tb_per_s']:.3f} TB/s (H200 {h200['copy_tb_per_s']:.2f}), "
          f"bf16 GEMM {card['bf16_tflops']:.0f} TFLOP/s (H200 {h200['bf16_tflops']:.0f})")
for row in r["flotilla"]:
    if "ms_per_step" not in row:
        print(f"DECODE bs{row['batch']} ctx{row['context']}: {row.get('skipped')}")
        continue
    on_card = (f"card's roofline {row['roofline_ms_card']:.3f} ms = {row['x_roofline_card']:.3f}x"
               if row["roofline_ms_card"] else "card's roofline n/a")
    print(f"DECODE bf16 bs{row['batch']} ctx{row['context']}: {row['ms_per_step']:.3f} ms/step; H200 roofline "
          f"{row['roofline_ms']:.3f} ms = {row['x_roofline']:.3f}x; {on_card}; graphed "
          f"{row['graphed_steps']}/{row['steps']}")
PY
      ;;
    tests) timeout $(left 40) python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs \
             -k "not latency_json" $R/tests/test_bench_card_peaks.py > /tmp/roof23-tests.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "passed|failed|SKIPPED|Error" /tmp/roof23-tests.log | tail -6 | cut -c1-300 | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

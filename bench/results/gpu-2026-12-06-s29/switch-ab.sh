#!/bin/bash
# Session 29 (gil29): the API process's GIL switch interval (engine/server/cli.py SWITCH_INTERVAL, 0.5 ms since
# session 29; Python's own is 5 ms) at issue 19's serving load, A B A on one GPU: `flotilla serve` (Llama-3.1-8B
# shape, random bf16, the engine flags of bench/results/http6-gpu.sh), bench/serve.py 1,000 x (512 / 128) at up to
# 512 streams from 2 client processes, FLOTILLA_API_SWITCH_INTERVAL 0.005 (old), 0.0005 (new), 0.005 again.
# Budget ~450 s (each stage ~40-70 s start, ~30 s warm-up, ~30 s measured). From the repository root, carrying .whl:
#   OUT=... bash bench/results/gpu-2026-12-06-s29/switch-ab.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 450
export VLLM_ENABLE_V1_MULTIPROCESSING=1
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
ENGINE="--max-model-len 4096 --max-num-seqs 512 --max-num-batched-tokens 16384 --load-format dummy"
LOAD="--num-prompts 1000 --input-len 512 --output-len 128 --vocab-size 128256"
L=$OUT/switch-ab.log
n=0
for interval in 0.005 0.0005 0.005; do
  n=$((n + 1))
  echo "=== run $n interval $interval $(date +%T) ($(left 0) s left)" | tee -a $L
  FLOTILLA_API_SWITCH_INTERVAL=$interval timeout -s INT -k 30 $(left 140) \
    python3 $R/bench/serve.py --launch --model /tmp/llama8b --serve-args "$ENGINE" $LOAD --max-concurrency 512 \
    --clients 2 --warmups 1 --server-log $OUT/switch-$n-server.log --json $OUT/switch-$n.json 2>&1 | tail -8 | tee -a $L
done
python3 - "$OUT" <<'PY' | tee -a $L
import json, sys
for n, interval in enumerate(("0.005", "0.0005", "0.005"), 1):
    try:
        r = json.load(open(f"{sys.argv[1]}/switch-{n}.json"))
        print(f"SUMMARY run {n} interval {interval}: {r['output_throughput']:.0f} output tok/s, TTFT p50 {r['median_ttft_ms']:.0f} ms, ITL p50 {r['median_itl_ms']:.1f} ms, server CPU {r.get('server_cpu_busy')}")
    except (OSError, ValueError) as e:
        print(f"SUMMARY run {n} interval {interval}: n/a ({e})")
PY

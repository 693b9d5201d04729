#!/bin/bash
# Issue 19, "Serving through HTTP first" (session 6, branch http6): offline vs `flotilla serve` with and without
# this branch's two levers, in ONE device call, Llama-3.1-8B shape with random bf16 weights, every run with the
# engine's step trace (FLOTILLA_STEP_TRACE: one JSON line per step; bench/step_trace_report.py summarizes it):
#   offline     bench/throughput.py, 1,000 x (512 in / 128 out), --max-num-seqs 512 --max-num-batched-tokens 16384
#   serve-off   bench/serve.py against `flotilla serve` with the same engine flags, 512 concurrent streams, 2 client
#               processes, levers off: FLOTILLA_CORE_OUTPUT_THREAD=0 (the core writes its output messages from the
#               step loop, as main) and no --max-cudagraph-capture-size (mixed graphs up to 512 tokens, as main)
#   serve-on    the same with both levers: the core's output thread (default on this branch) and
#               --max-cudagraph-capture-size 4096 (mixed graphs up to 4,096 tokens)
#   tests       the GPU test of the larger mixed graphs (greedy tokens == the CPU reference) and the graphs' base test
#   serve-thread / serve-graphs (not in the default STAGES): one lever each, for attribution
# Budget: ~430 s (tests ~30 s, offline ~50 s; each serve stage ~40-70 s to start with graph capture, ~30 s warm-up, ~30 s
# measured). Run from the repository root on the H200 machine, carrying .whl (the wheels listed in
# bench/results/http-speed-gpu.sh: pydantic stack, fastapi/starlette/uvicorn/httpx/... stack):
#   BUDGET_S=450 bash bench/results/http6-gpu.sh
# Session 6b: bench/serve.py gives each concurrency slot its own httpx client (httpx's shared pool held the second
# wave of requests ~5 s in the client); its JSON has send_delay (slot taken -> request head written: the client's
# own delay) and head_delay (-> response head: the server's), http6-serve-*-requests.jsonl each request's
# time.monotonic() marks (the step traces' clock). Confirming run (~230 s):
#   STAGES="offline serve-on serve-off" BUDGET_S=300 bash bench/results/http6-gpu.sh
# Outputs in $OUT: http6-gpu.log, http6-{offline,serve-*}.json, http6-*-steps.jsonl (traces), http6-*-server.log,
# http6-steps-report.json (the traces' summaries), and the summary lines at the end of the log.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 450
export VLLM_ENABLE_V1_MULTIPROCESSING=1
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
ENGINE="--max-model-len 4096 --max-num-seqs 512 --max-num-batched-tokens 16384 --load-format dummy"
LOAD="--num-prompts 1000 --input-len 512 --output-len 128 --vocab-size 128256"
L=$OUT/http6-gpu.log
python3 -c "import fastapi, uvicorn, httpx, jinja2, flotilla.engine.server.cli" 2>&1 | tail -2 | tee -a $L
serve() {  # serve NAME OUTPUT_THREAD EXTRA_FLAGS TIME_LIMIT_S
  echo "=== serve-$1 $(date +%T) FLOTILLA_CORE_OUTPUT_THREAD=$2 extra flags: ${3:-none}" | tee -a $L
  # SIGINT on timeout: bench/serve.py then stops its server (the next stage needs the GPU's memory).
  FLOTILLA_CORE_OUTPUT_THREAD=$2 FLOTILLA_STEP_TRACE=$OUT/http6-serve-$1-steps.jsonl timeout -s INT -k 30 $(left $4) \
    python3 $R/bench/serve.py --launch --model /tmp/llama8b --serve-args "$ENGINE $3" $LOAD --max-concurrency 512 \
    --clients 2 --warmups 1 --server-log $OUT/http6-serve-$1-server.log --json $OUT/http6-serve-$1.json \
    --request-log $OUT/http6-serve-$1-requests.jsonl 2>&1 \
    | tee -a $L | tail -20
  grep -E "captured|runs eagerly" $OUT/http6-serve-$1-server.log | head -6 | tee -a $L
}
for s in ${STAGES:-tests offline serve-off serve-on}; do
  case $s in
    # Greedy tokens of the tiny model with mixed graphs up to 1,024 tokens equal the CPU reference (~20 s).
    tests) echo "=== tests $(date +%T)" | tee -a $L
      timeout $(left 60) python3 -m pytest $R/tests/engine/test_gpu.py -m gpu -k "larger_mixed or cuda-graphs-async" -q \
        -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -4 | tee -a $L ;;
    offline) echo "=== offline $(date +%T)" | tee -a $L
      FLOTILLA_STEP_TRACE=$OUT/http6-offline-steps.jsonl timeout $(left 100) python3 $R/bench/throughput.py \
        --model /tmp/llama8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 \
        --max-num-batched-tokens 16384 --json $OUT/http6-offline.json 2>&1 | tee -a $L \
        | grep -E "Error|error|output_tokens_per_s|captured" | tail -4 ;;
    serve-off) serve off 0 "" 150 ;;
    serve-on) serve on 1 "--max-cudagraph-capture-size 4096" 170 ;;
    serve-thread) serve thread 1 "" 150 ;;
    serve-graphs) serve graphs 0 "--max-cudagraph-capture-size 4096" 170 ;;
  esac
done
TRACES=$(ls $OUT/http6-*-steps.jsonl 2>/dev/null)
[ -n "$TRACES" ] && python3 $R/bench/step_trace_report.py $TRACES --json $OUT/http6-steps-report.json 2>&1 | tee -a $L
python3 - <<'EOF' | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
try:
    offline = json.load(open(f"{out}/http6-offline.json"))["flotilla"]["output_tokens_per_s"]
except (OSError, KeyError) as exc:
    offline = None
    print("no offline figure:", exc)
for name in ("off", "on", "thread", "graphs"):
    try:
        s = json.load(open(f"{out}/http6-serve-{name}.json"))
    except OSError:
        continue
    share = f" = {s['output_throughput'] / offline:.1%} of offline {offline:.0f}" if offline else ""
    print(f"serve-{name}: {s['output_throughput']:.0f} output tok/s{share}; TTFT p50/p99 {s['median_ttft_ms']:.0f}/"
          f"{s['p99_ttft_ms']:.0f} ms, TPOT p50 {s['median_tpot_ms']:.1f} ms, ITL p50/p99 {s['median_itl_ms']:.1f}/"
          f"{s['p99_itl_ms']:.1f} ms; client send delay p50/p99/max {s.get('median_send_delay_ms', 0):.0f}/"
          f"{s.get('p99_send_delay_ms', 0):.0f}/{s.get('max_send_delay_ms', 0):.0f} ms, head delay p50/p99 "
          f"{s.get('median_head_delay_ms', 0):.0f}/{s.get('p99_head_delay_ms', 0):.0f} ms; CPU busy: API {s.get('server_cpu_busy', 0):.2f}, core "
          f"{s.get('server_children_cpu_busy', 0):.2f}, clients {[round(c, 2) for c in s['client_cpu_busy']]}")
EOF
echo "=== done $(date +%T)" | tee -a $L

#!/bin/bash
# Issue 19, "Serving through HTTP": offline vs `flotilla serve` on the H200 in one device call, same engine
# settings, Llama-3.1-8B shape with random bf16 weights (bench/model_dirs.py; word-level tokenizer).
# Run from the repository root on the H200 machine, carrying .whl with the pydantic wheels of
# gpu-sweep-2026-12-02-s2.sh plus the HTTP stack (py3-none-any unless said):
#   fastapi 0.165.0, starlette 1.10.0, annotated-doc 0.0.7, anyio 4.16.0, idna 3.20, uvicorn 0.55.0,
#   click 8.5.1, h11 0.16.0, httpx 0.29.0, httpcore 1.0.9, certifi 2026.10.19.post1, opentelemetry-api 1.45.2,
#   importlib-metadata, zipp (FACTS: fastapi imports opentelemetry there), and optionally py-spy 0.4.3
#   (py2.py3-none-manylinux x86_64) for the profile stage.
# Stages are independent; each has its own time limit. Outputs land in $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh"
# Without bench/ on the path, as in the measured runs of 2026-12-03 (the servers' path; bench/ scripts find
# their own folder anyway).
export PYTHONPATH=/tmp/site:/tmp/p
# The engine core in its own process (issue 19; `flotilla serve`'s default since 2026-12-03 s4, exported here so
# the figures are the core's whatever the caller's environment); VLLM_ENABLE_V1_MULTIPROCESSING=0 measures the
# in-thread engine.
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-1}
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
ENGINE="--max-model-len 4096 --max-num-seqs 512 --max-num-batched-tokens 16384 --load-format dummy"
LOAD="--num-prompts 1000 --input-len 512 --output-len 128 --vocab-size 128256"
L=$OUT/http-speed.log
# Fail fast on a missing wheel (jinja2 and MarkupSafe come with the machine's transformers, else carry them).
python3 -c "import fastapi, uvicorn, httpx, jinja2, flotilla.engine.server.cli" 2>&1 | tail -2 | tee -a $L
for s in ${STAGES:-offline serve profile}; do
  echo "=== $s $(date +%T)" | tee -a $L
  case $s in
    offline) timeout 240 python3 $R/bench/throughput.py --model /tmp/llama8b --load-format dummy --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --json $OUT/gpu-http-speed-offline.json 2>&1 | tee -a $L | grep -E "Error|error|output_tokens_per_s" | tail -4 ;;
    # Two client processes, so the client is not the bottleneck (client_cpu_busy says how busy each was).
    serve) timeout 420 python3 $R/bench/serve.py --launch --model /tmp/llama8b --serve-args "$ENGINE" $LOAD --max-concurrency 512 --clients 2 --warmups 1 --json $OUT/gpu-http-speed-serve.json 2>&1 | tee -a $L | tail -16 ;;
    serve-1client) timeout 420 python3 $R/bench/serve.py --launch --model /tmp/llama8b --serve-args "$ENGINE" $LOAD --max-concurrency 512 --clients 1 --warmups 1 --json $OUT/gpu-http-speed-serve-1client.json 2>&1 | tee -a $L | tail -16 ;;
    # Where the server's host time goes: py-spy on the API process and on the engine-core process (its
    # child, `spawn_main`), both at once for 25 s of the measured run (raw stacks, every thread). The
    # measured run starts when the warm-up's 1,000 requests have finished (vllm:request_success_total);
    # each run takes ~31 s on the H200, so a fixed sleep misses it. --nonblocking: no pauses of the target.
    profile) if command -v py-spy > /dev/null; then
        python3 -m flotilla.engine.server /tmp/llama8b --host 127.0.0.1 --port 18777 --uvicorn-log-level warning $ENGINE --disable-log-stats > $OUT/profile-server.log 2>&1 &
        SP=$!
        for i in $(seq 300); do python3 -c "import httpx; httpx.get('http://127.0.0.1:18777/health').raise_for_status()" 2>/dev/null && break; sleep 1; done
        CORE=$(ps --ppid $SP -o pid=,args= | awk '/spawn_main/ {print $1; exit}')
        echo "API process $SP, engine core ${CORE:-none (VLLM_ENABLE_V1_MULTIPROCESSING=0?)}" | tee -a $L
        (timeout 300 python3 $R/bench/serve.py --base-url http://127.0.0.1:18777 $LOAD --max-concurrency 512 --clients 2 --warmups 1 > $OUT/profile-load.log 2>&1 &)
        for i in $(seq 240); do
          DONE=$(python3 -c "import httpx; print(int(sum(float(l.rpartition(' ')[2]) for l in httpx.get('http://127.0.0.1:18777/metrics').text.splitlines() if l.startswith('vllm:request_success_total'))))" 2>/dev/null)
          [ "${DONE:-0}" -ge 1000 ] && break; sleep 0.5
        done
        echo "warm-up done ($DONE requests) at $(date +%T): profiling" | tee -a $L
        sleep 2
        timeout 60 py-spy record --pid $SP --threads --nonblocking -f raw -d 25 -o $OUT/gpu-http-speed-serve-pyspy-api.txt > $OUT/pyspy-api.log 2>&1 &
        PA=$!
        if [ -n "$CORE" ]; then timeout 60 py-spy record --pid $CORE --threads --nonblocking -f raw -d 25 -o $OUT/gpu-http-speed-serve-pyspy-core.txt > $OUT/pyspy-core.log 2>&1; fi
        wait $PA; tail -n 2 $OUT/pyspy-api.log $OUT/pyspy-core.log 2>/dev/null | tee -a $L
        for f in $OUT/gpu-http-speed-serve-pyspy-*.txt; do [ -f $f ] && echo "$f: $(awk '{n += $NF} END {print n}' $f) samples" | tee -a $L; done
        sleep 8; tail -n 16 $OUT/profile-load.log | tee -a $L
        kill $SP; wait $SP 2>/dev/null
      else echo "no py-spy: skipped"; fi ;;
  esac
done
python3 - <<'EOF' | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
try:
    offline = json.load(open(f"{out}/gpu-http-speed-offline.json"))["flotilla"]["output_tokens_per_s"]
    for name in ("serve", "serve-1client"):
        s = json.load(open(f"{out}/gpu-http-speed-{name}.json"))
        print(f"{name}: {s['output_throughput']:.0f} output tok/s = {s['output_throughput'] / offline:.1%} of offline "
              f"{offline:.0f}; TTFT p50/p99 {s['median_ttft_ms']:.0f}/{s['p99_ttft_ms']:.0f} ms, ITL p50/p99 "
              f"{s['median_itl_ms']:.1f}/{s['p99_itl_ms']:.1f} ms, event loop {s['server_main_thread_cpu_ms_per_token']:.3f} "
              f"ms CPU/token, client busy {s['client_cpu_busy']}")
except (OSError, KeyError) as exc:
    print("summary incomplete:", exc)
EOF
echo "=== done $(date +%T)"

#!/bin/bash
# Issue 19, "TTFT of a request whose 2,000-token prefix is cached >= 10x lower than uncached" (session 7, branch
# prefix7), in ONE device call on the Llama-3.1-8B shape with random bf16 weights. Default stages (~110 s):
#   on     bench/prefix.py, 2,000 cached + 20 new tokens, one engine, every lever on (the per-step tile map, one-sequence
#          mixed graphs, the measured launch of split attention `SPLIT_LAUNCH`); the TTFT is bench/prefix.py's:
#          add_request -> first token out; with the step trace and one cached request's GPU kernels (~30 s)
#   tests  GPU tests: greedy tokens of the tiny model with CUDA graphs == the CPU reference, cached-prefix extends from
#          one-sequence mixed graphs, one straddling the key-split boundary (~30 s)
#   attn   the prefill kernel's split tests compiled on the GPU, then bench/extend_attention.py: launch configurations
#          (BLOCK_N, key splits, warps, stages, bf16 partials) of the 20-token extend over 2,020 tokens as the graph runs
#          it, prefill kernel + merge, vs the decode kernel at one token; names the fastest correct one (~50 s)
# Other stages (STAGES="..."): best (the engine with attn's fastest launch, FLOTILLA_EXTEND_ATTN), off (levers off:
# FLOTILLA_PREFILL_TILE_MEMO=0, the tile map recomputed in every layer; FLOTILLA_ONE_SEQ_GRAPHS=0, a lone extend padded
# into the 32-sequence-slot mixed graph; FLOTILLA_EXTEND_ATTN=32,16,4,3, the old launch), memo / oneseq (one lever each),
# decode (bench/decode_profile.py batch 1 at context 2,020, ~30 s), gemm (bench/kernels.py gemv section at 1/20/32 rows,
# ~20 s), serve (the same request through `flotilla serve`, cached vs uncached client TTFT, ~90 s, HTTP wheels).
#   BUDGET_S=120 bash bench/results/prefix7-gpu.sh          (A/B: STAGES="on off" BUDGET_S=80)
# Outputs in $OUT: prefix7-gpu.log (summary at the end), prefix7-<stage>.json, prefix7-<stage>-steps.jsonl,
# prefix7-attn.json.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 120
L=$OUT/prefix7-gpu.log
ARGS="--shape llama-3.1-8b --load-format dummy --skip-batch --single-engine --prefix-len 2000 --suffix-len 20
  --output-len 16 --repeats 5 --max-num-batched-tokens 8192 --profile-kernels"
run() {  # run NAME TILE_MEMO ONE_SEQ_GRAPHS TIME_LIMIT_S [EXTEND_LAUNCH]
  echo "=== $1 $(date +%T) FLOTILLA_PREFILL_TILE_MEMO=$2 FLOTILLA_ONE_SEQ_GRAPHS=$3 FLOTILLA_EXTEND_ATTN=${5:-} ($((END - SECONDS)) s left)" | tee -a $L
  FLOTILLA_EXTEND_ATTN=${5:-} FLOTILLA_PREFILL_TILE_MEMO=$2 FLOTILLA_ONE_SEQ_GRAPHS=$3 FLOTILLA_STEP_TRACE=$OUT/prefix7-$1-steps.jsonl \
    timeout $(left $4) python3 $R/bench/prefix.py $ARGS --json $OUT/prefix7-$1.json > $OUT/prefix7-$1.out 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "Error|error|captured|runs eagerly" $OUT/prefix7-$1.out | tail -6 | tee -a $L
  rm -f $OUT/prefix7-$1.out
}
for s in ${STAGES:-on tests attn}; do
  case $s in
    tests) echo "=== tests $(date +%T)" | tee -a $L
      timeout $(left 50) python3 -m pytest $R/tests/engine/test_gpu.py -m gpu -k "cached_prefix or cuda-graphs-async" -q \
        -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -4 | tee -a $L ;;
    # The prefill kernel's tests compiled on the GPU (the split-boundary case included), then the sweep: each launch
    # configuration of the 20-token extend over 2,020 tokens in a CUDA graph, prefill kernel + merge (~50 s).
    attn) echo "=== attn $(date +%T)" | tee -a $L
      timeout $(left 20) python3 -m pytest $R/tests/kernels/test_paged_prefill.py -k "split_keys or half" -q -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -2 | tee -a $L
      timeout $(left 40) python3 $R/bench/extend_attention.py --json $OUT/prefix7-attn.json 2>&1 | tail -16 | tee -a $L
      BEST=$(python3 -c "import json; print(json.load(open('$OUT/prefix7-attn.json'))['best']['env'])" 2>/dev/null)
      echo "best launch: ${BEST:-none}" | tee -a $L ;;
    # The engine with the sweep's best launch for short extends (FLOTILLA_EXTEND_ATTN), levers on.
    best) [ -n "${BEST:-}" ] && run best 1 1 45 "$BEST" ;;
    # The reference the cached request is held to: a graphed batch-1 decode step at context 2,020 (kernels by group).
    decode) echo "=== decode $(date +%T)" | tee -a $L
      timeout $(left 60) python3 $R/bench/decode_profile.py --shape llama-3.1-8b --batch-sizes 1 --context 2020 \
        --steps 20 2>&1 | grep -E "^batch|^ +[0-9.]+ us|Error" | head -10 | tee -a $L ;;
    # cuBLAS vs the Triton GEMV at 1, 20 and 32 rows on the four projections (a 20-token extend pads to 32 rows in its
    # mixed graph; decode at one row takes the GEMV for qkv/o/down): is the extend's GEMM time the decode's?
    gemm) echo "=== gemm $(date +%T)" | tee -a $L
      timeout $(left 40) python3 $R/bench/kernels.py --sections gemv --gemv-rows 1,20,32 --out $OUT/prefix7-gemv.json \
        2>&1 | grep -E "^gemv|^copy|Error" | tee -a $L ;;
    off) run off 0 0 70 32,16,4,3 ;;
    on) run on 1 1 50 ;;
    # Through `flotilla serve` (not in the default STAGES; ~90 s, needs the HTTP wheels): one server, 10 sequential
    # requests of 2,000 shared + 20 own tokens (bench/serve.py --random-prefix-len: cached after the warm-up) vs 10 of
    # 2,020 random tokens (never cached); the client's TTFT, 1 output token each.
    serve) echo "=== serve $(date +%T)" | tee -a $L
      python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      FLOTILLA_STEP_TRACE=$OUT/prefix7-serve-steps.jsonl VLLM_ENABLE_V1_MULTIPROCESSING=1 python3 -m flotilla.engine.server \
        /tmp/llama8b --host 127.0.0.1 --port 8765 --uvicorn-log-level warning --max-model-len 2100 --load-format dummy \
        --max-num-batched-tokens 8192 > $OUT/prefix7-serve-server.log 2>&1 &
      SERVER=$!
      timeout $(left 100) python3 -c "
import time, urllib.request
while True:
    try:
        urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=1); break
    except OSError:
        time.sleep(0.5)" && for mode in cached uncached; do
        [ $mode = cached ] && LEN="--random-prefix-len 2000 --input-len 20" || LEN="--input-len 2020"
        echo "--- serve $mode: $LEN" | tee -a $L
        timeout $(left 40) python3 $R/bench/serve.py --base-url http://127.0.0.1:8765 --num-prompts 10 --max-concurrency 1 \
          --output-len 1 --vocab-size 128256 --warmups 1 $LEN --json $OUT/prefix7-serve-$mode.json 2>&1 \
          | grep -E "completed|failed|ttft|Error" | tee -a $L
      done
      kill $SERVER; wait $SERVER
      grep -E "captured|Error" $OUT/prefix7-serve-server.log | head -4 | tee -a $L ;;
    memo) run memo 1 0 75 ;;  # one lever each, for attribution (not in the default STAGES)
    oneseq) run oneseq 0 1 75 ;;
  esac
done
python3 - <<'EOF' | tee -a $L
import json, os, statistics
out = os.environ.get("OUT", "/tmp/out")
try:
    att = json.load(open(f"{out}/prefix7-attn.json"))
    ranked = sorted((c for c in att["configs"] if "us" in c), key=lambda c: c["us"])
    print(f"extend attention ({att['new']} new over {att['context']}, padded {att['padded']}): default "
          f"{att['configs'][0].get('us', float('nan')):.1f} us, decode kernel 1 token {att.get('decode_one_token_us', 0):.1f} us;"
          " fastest: " + ", ".join(f"{c['env']} {c['us']:.1f} us (err {c['rel_err']:.1e})" for c in ranked[:5]))
except (OSError, ValueError, KeyError):
    pass
for name in ("off", "on", "best", "memo", "oneseq"):
    try:
        r = json.load(open(f"{out}/prefix7-{name}.json"))
    except (OSError, ValueError):
        continue
    s = r["single_cold_vs_warm"]
    print(f"{name}: uncached {1e3 * s['uncached_ttft_s']:.2f} ms, cached {1e3 * s['cached_ttft_s']:.2f} ms -> "
          f"{s['speedup']:.2f}x; cached pairs {[round(1e3 * w, 2) for _, w in s['pairs_s']]}")
    for ph in s.get("cached_phases", [])[:2]:
        print(f"   phases: add {ph['add_ms']:.3f} ms, step() calls {ph['step_calls_ms']}")
    p = r.get("cached_request_profile")
    if p:
        print(f"   profiled request {p['ttft_ms_profiled']:.2f} ms: GPU busy {p['gpu_busy_us']:.0f} us, span "
              f"{p['gpu_span_us']:.0f} us, {p['launches']} kernels; groups "
              + ", ".join(f"{g} {us:.0f}" for g, us in p["groups_us"].items()))
        for k in p["kernels"][:14]:
            print(f"      {k['us']:8.1f} us x{k['launches']:<4} {k['name'][:100]}")
    try:
        steps = [json.loads(x) for x in open(f"{out}/prefix7-{name}-steps.jsonl")]
    except OSError:
        continue
    ext = [x for x in steps if x["prefill"] and x["prefill_tokens"] <= 64]  # the cached requests' extends
    if ext:
        med = lambda k: statistics.median(x[k] for x in ext)  # noqa: E731
        print(f"   trace: {len(ext)} extend steps, graph sizes {sorted({x['graph'] for x in ext})}, median host "
              f"{med('host_ms')} ms, sync {med('sync_ms')} ms, step {med('step_ms')} ms, engine TTFT median "
              f"{statistics.median(x['ttft_ms'] for x in ext if 'ttft_ms' in x)} ms")
try:
    c, u = (json.load(open(f"{out}/prefix7-serve-{m}.json")) for m in ("cached", "uncached"))
    print(f"serve: client TTFT p50 cached {c['median_ttft_ms']:.2f} ms vs uncached {u['median_ttft_ms']:.2f} ms -> "
          f"{u['median_ttft_ms'] / c['median_ttft_ms']:.2f}x (p99 {c['p99_ttft_ms']:.2f} / {u['p99_ttft_ms']:.2f})")
except (OSError, ValueError, KeyError, ZeroDivisionError):
    pass
EOF

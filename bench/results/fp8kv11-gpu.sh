source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
# Issue 22's floor on the H200, one call (<= 150 s of device time; BUDGET_S, default 150): with --kv-cache-dtype fp8
# the decode step at batch 64 x context 4,096 (Llama-3.1-8B shape, bf16 weights) <= 0.70x the bf16-KV step.
# Branch fp8kv11: the key streams in transposed form (`_attend_streams_t`: K @ Q^T and V^T @ P^T, the GQA group
# of 4 query heads padded to 8 mma columns instead of 16 rows; Triton 3.6 sm_90: 128 registers against 170, 301
# loop instructions a 32-key tile against 398, half the HMMA and accumulator-rescale FMULs), at one split and at
# 2 / 4 splits (the registers now let 8 two-warp or 16 one-warp programs share an SM); and the same products with
# the streams over 2 / 4 / 8 neighbouring KV heads ("h", `_attend_heads_t`: a program reads a key's heads side by
# side, 256 B to 1 KB contiguous instead of 128 B), 16-key tiles at 4 splits.
# Stages, each under its own limit (capped by what is left):
#   sweep  bench/fp8_kv_decode.py --batches 64 --workers 5 (limit 35 s; its 10 rows compiled in 5 processes
#          first): the attention kernel at 64 x 4,096: the bf16 pool at its default, the fp8 pool at main's
#          default (32/2/4 cvtpx, 2 streams, 1 split: the baseline), then (likeliest first) t 32/2/3 at 2 splits,
#          t 16/1/3 at 4, h 16/2/2 and h 16/4/2 at 4, t 32/2/4 at 1, h 16/8/2 at 4, t 32/2/3 at 2 with the fused
#          merge, main's streams at 2 splits. Prints us, GB/s (of each pool's own bytes) and rel_err per row (each
#          written as it completes: a cut sweep keeps its rows).
#   fp8kv  bench/quant_gpu.py --kv-cache-dtype fp8 --jobs bs64ab --relaunch default (limit 80 s): ONE engine, one
#          set of 64 requests of 4,096 tokens prefilled once, timed in the order A B B A (32 steps a phase, the
#          batch-64 decode graphs captured again at each change of launch): A = FLOTILLA_DECODE_FP8_LAUNCH /
#          FLOTILLA_DECODE_WAVE (/ FLOTILLA_DECODE_FUSED_MERGE=1) = the sweep's fastest "t" or "h" row
#          (FP8KV11_LAUNCH="LAUNCH@WAVE[@fused]" overrides; fallback 32,2,3,cvtpx,2t@8 = 2 splits), the start-up
#          launch; B = main's default (all unset). Each figure is the mean of its two phases.
#   bf16   the same engine step with bf16 KV (the rest, ~30 s; start-up ~12 s with a warm Triton cache).
#   tests  if >= 25 s are left: the GPU test of the t / h launches at Llama heads in CUDA graphs
#          (test_cuda_fp8_transposed_streams_at_llama_heads) and the cvtpx operand-path test.
#   summary  fp8/bf16 step ratios, the branch's and main's (target <= 0.70) -> fp8kv11.json (always runs).
# Output: $OUT/fp8kv11.log (read first), $OUT/fp8kv11.json (sweep rows, engine runs, summary); the engines' logs'
# tails are at the end of the .log. Run from the repository root, carrying .whl (pydantic stack) as the others:
#   BUDGET_S=150 bash bench/results/fp8kv11-gpu.sh
# Without the sweep (the engine at a given launch, ~120 s):  FP8KV11_LAUNCH=32,2,3,cvtpx,2t@8 STAGES="fp8kv bf16
#   summary" BUDGET_S=120 bash bench/results/fp8kv11-gpu.sh
L=$OUT/fp8kv11.log; W=/tmp/fp8kv11w; mkdir -p $W
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
for s in ${STAGES:-sweep fp8kv bf16 tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    sweep) timeout $(left 35) python3 $R/bench/fp8_kv_decode.py --json $W/sweep.json --batches 64 --workers 5 \
        > $W/sweep.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -vE "Warning|warn" $W/sweep.log | cut -c1-300 | tee -a $L ;;
    fp8kv) mine=$(python3 - $W/sweep.json <<'PY'
import json, os, sys
if os.environ.get("FP8KV11_LAUNCH"):
    print(os.environ["FP8KV11_LAUNCH"]); sys.exit()
try:
    rows = [r for r in json.load(open(sys.argv[1]))["cases"] if r.get("form") in ("t", "h") and "us" in r
            and max(r.get("rel_err", 1), r.get("rel_err_after", 0)) < 0.1]
except (OSError, ValueError, KeyError):
    rows = []
if not rows:
    print("32,2,3,cvtpx,2t@8"); sys.exit()
r = min(rows, key=lambda r: r["us"])
# FLOTILLA_DECODE_WAVE giving the row's splits at batch 64 on 132 SMs (bench/fp8_kv_decode.py engine_wave)
programs = 64 * (8 // r["key_streams"] if r["form"] == "h" else 8)
wave = -(-r.get("num_splits", 1) * programs // 132)
print(f"{r['block_n']},{r['num_warps']},{r['num_stages']},cvtpx,{r['key_streams']}{r['form']}@{wave}"
      + ("@fused" if r.get("fused_merge") else ""))
PY
)
      echo "$mine" > $W/mine.txt
      echo "fp8 engine: A = FLOTILLA_DECODE_FP8_LAUNCH@FLOTILLA_DECODE_WAVE=$mine (start-up), B = main's default; A B B A" | tee -a $L
      IFS=@ read -r launch wave fused <<< "$mine"
      env -u FLOTILLA_DECODE_FP8_LAUNCH -u FLOTILLA_DECODE_WAVE -u FLOTILLA_DECODE_FUSED_MERGE \
        FLOTILLA_DECODE_FP8_LAUNCH=$launch ${wave:+FLOTILLA_DECODE_WAVE=$wave} ${fused:+FLOTILLA_DECODE_FUSED_MERGE=1} \
        timeout $(left 80) python3 $R/bench/quant_gpu.py --model /tmp/llama8b \
        --name fp8kv --kv-cache-dtype fp8 --jobs bs64ab --max-num-seqs 64 --relaunch default \
        --json $W/engine-fp8kv.json > $W/engine-fp8kv.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "KV cache:|Error|error|captured" $W/engine-fp8kv.log | tail -5 | cut -c1-300 | tee -a $L ;;
    bf16) env -u FLOTILLA_DECODE_FP8_LAUNCH -u FLOTILLA_DECODE_WAVE -u FLOTILLA_DECODE_FUSED_MERGE timeout $(left 60) python3 $R/bench/quant_gpu.py \
        --model /tmp/llama8b --name bf16 --jobs bs64 --max-num-seqs 64 --json $W/engine-bf16.json > $W/engine-bf16.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "KV cache:|Error|error" $W/engine-bf16.log | tail -4 | cut -c1-300 | tee -a $L ;;
    tests) [ $((END - SECONDS)) -lt 25 ] && { echo "skipped: < 25 s left" | tee -a $L; continue; }
      timeout $(left 40) python3 -m pytest $R/tests/kernels/test_fp8_kv_cache.py -m gpu -q -p no:cacheprovider \
        -k "transposed_streams or (operand_paths_at_llama_heads and cvtpx and not cvtpx_k)" -c $R/pyproject.toml --rootdir=$R \
        > $W/tests.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "Error|error:|passed|failed|FAILED" $W/tests.log | tail -8 | cut -c1-300 | tee -a $L ;;
    summary) MINE=$(cat $W/mine.txt 2>/dev/null) python3 - $W <<'PY' 2>&1 | tee -a $L
import json, os, sys
w, out = sys.argv[1], os.environ.get("OUT", "/tmp/out")
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        return {"error": repr(e)}
fp8, bf16 = load(f"{w}/engine-fp8kv.json"), load(f"{w}/engine-bf16.json")
base = bf16.get("bs64", {}).get("ms_per_step")
mine = os.environ.get("MINE", "?")
ab = fp8.get("bs64ab", {})
steps = {"bf16 KV": base, f"fp8 KV fp8kv11 {mine}": ab.get("a_ms"), "fp8 KV main's default": ab.get("b_ms")}
ratios = {k: round(v / base, 4) for k, v in steps.items() if v and base and k != "bf16 KV"}
sweep = load(f"{w}/sweep.json")
rows = [{k: r.get(k) for k in ("pool", "block_n", "num_warps", "num_stages", "key_streams", "form", "num_splits",
                               "fused_merge", "us", "gbps", "rel_err", "error") if k in r} for r in sweep.get("cases", [])]
summary = {"step_ms_bs64_ctx4096": steps, "ratio_vs_bf16_kv": ratios, "target": "<= 0.70",
           "phases": [(p.get("name"), p.get("spec"), round(p.get("ms_per_step", 0), 4), p.get("graphed_steps"),
                       round(p.get("recapture_s", 0), 1)) for p in ab.get("phases", [])],
           "running_at_end": ab.get("running_at_end"), "bf16_graphed": bf16.get("bs64", {}).get("graphed_steps"),
           "startup_s": {"fp8": fp8.get("startup_s"), "bf16": bf16.get("startup_s")}}
json.dump({"summary": summary, "sweep_rows": rows, "engine": {"fp8kv": fp8, "bf16": bf16}},
          open(f"{out}/fp8kv11.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
for r in rows:
    print("  kernel", r)
for k, v in ratios.items():
    print(f"RATIO {k}: {steps[k]:.3f} ms / bf16 {base:.3f} ms = {v:.3f} ({'MET' if v <= 0.70 else 'missed'} <= 0.70)")
PY
      for f in engine-fp8kv.log engine-bf16.log tests.log; do
        [ -f $W/$f ] && { echo "--- tail $f"; grep -v "runs eagerly" $W/$f | tail -15 | cut -c1-300; } >> $L
      done ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

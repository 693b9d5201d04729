source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
# Issue 22's fp8-KV floor on the H200, one call (BUDGET_S, default 200 s of device time): with --kv-cache-dtype fp8
# the decode step at batch 64 x context 4,096 <= 0.70x the bf16-KV step (session 23: 9.233 vs 12.150 ms = 0.760x).
# Branch kvfp8 (session 24): `_attend_heads_t`'s LEAN loop (kernels/triton_paged_decode.py, switch
# FLOTILLA_DECODE_FP8_LEAN, default off): the full tiles without key masks, the partial last tile masked, a 32-key
# stream's pages found a page at a time (64-key tiles, 2 streams of 32 a head, no longer pay a division and a 64-bit
# product a key), a pointer a page and 32-bit offsets in it. The same numbers (bit-equal under the interpreter).
# Triton 3.6 sm_90 SASS of the loop over full tiles: h2 32/4 297 -> 269 instructions, h2 64/4 560 -> 431: 18.6 ->
# 16.8 / 13.5 warp instructions a (key, KV head), no spills (docs/quantization.md, session 24).
# Stages, each under its own limit (capped by what is left):
#   sweep  bench/fp8_kv_decode.py --batches 64 --grid kvfp8 --workers 8 (limit 45 s): the attention kernel at
#          64 x 4,096 in one process: the bf16 pool (default), the fp8 pool's default (h2 32/4/3, one split), then
#          fp8_kv_decode.KVFP8_GRID (lean at h2 32/4/3, h2 64/4/3 plain and lean, lean h2 64/4/2, h2 32/4/4,
#          h2 32/4/3 at 2 splits (128 registers: 4 programs an SM, the merge kernel), h2 64/8/2, h4 64/8/3 and
#          64/8/2), then bf16 and the default / lean 32/4/3 / lean 64/4/3 on a table of
#          consecutive pages. us, GB/s (each pool's own bytes), rel_err per row (the `lean` field marks the switch).
#   step   bench/quant_gpu.py --kv-cache-dtype fp8 --jobs bs64ab (limit 100 s; one engine): the fp8 pool's default
#          launch (A) against the sweep's fastest lean row with FLOTILLA_DECODE_FP8_LEAN=1 (B), the same 64 requests
#          of 4,096 tokens, A B B A (`ab_bs64`); KVFP8_SPEC="LAUNCH@WAVE@lean" overrides the pick, fallback
#          64,4,3,cvtpx,4h2@2@lean. The ratio is quoted against session 23's bf16-KV step (12.150 ms, H200).
#   tests  the fp8 KV GPU kernel tests of the "h" forms with FLOTILLA_DECODE_FP8_LEAN=1 (limit 45 s): kv15's launches
#          (h2 32/4 and 64/4 and 64/8, h4, h; 1-2 splits) and the "h" rows of the transposed-streams test at Llama
#          heads (sequences of 4,000, 300 and 17 keys) against the reference, called and replayed from CUDA graphs,
#          now through the lean loop. (The CPU lean-vs-masked test compiles ~50 variants: left to the interpreter.)
#   summary (always) kernel us / GB/s per row, the A/B step, a VERDICT line.
# Output: $OUT/kvfp8.log (summary first, then every stage's lines), $OUT/sweep.json, $OUT/step.json,
# $OUT/{sweep,step,tests}.out (each stage's whole output).
# Run from the repository root (a `git archive` of branch kvfp8), carrying .whl (pydantic stack) as the others:
#   OUT=... bash bench/results/kvfp8-24-gpu.sh
export OMP_NUM_THREADS=1
L=$OUT/body.log; : > $L  # run_stage's log; the summary goes on top of it in $OUT/kvfp8.log
PYTEST="python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
# B of the step: the sweep's fastest lean row (not on the table of consecutive pages) as LAUNCH@WAVE@lean
pick() { python3 - $OUT/sweep.json <<'PY'
import json, sys
from fp8_kv_decode import engine_wave  # bench/ is on the path (gpu-env.sh)
try:
    rows = [r for r in json.load(open(sys.argv[1]))["cases"] if r.get("lean") and "us" in r and not r.get("table")
            and max(r["rel_err"], r["rel_err_after"]) < 0.1]
except (OSError, ValueError, KeyError):
    rows = []
if not rows:
    print("64,4,3,cvtpx,4h2@2@lean"); sys.exit()
r = min(rows, key=lambda r: r["us"])
print(f"{r['block_n']},{r['num_warps']},{r['num_stages']},cvtpx,{r['key_streams']}{r['form']}@{engine_wave(r)}@lean")
PY
}
for s in ${STAGES:-sweep step tests summary}; do
  case $s in
    sweep) run_stage sweep 45 "^  |^b64|compiled" python3 $R/bench/fp8_kv_decode.py --json $OUT/sweep.json \
        --batches 64 --grid kvfp8 --workers 8 ;;
    step) spec=${KVFP8_SPEC:-$(pick)}
      echo "step: B = $spec" | tee -a $L
      python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      run_stage step 100 "quant_gpu|bs64ab" env -u FLOTILLA_DECODE_FP8_LAUNCH -u FLOTILLA_DECODE_WAVE \
        -u FLOTILLA_DECODE_FP8_LEAN python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name fp8kv-lean \
        --kv-cache-dtype fp8 --jobs bs64ab --relaunch "$spec" --json $OUT/step.json ;;
    tests) run_stage tests 45 "passed|failed|FAILED|error" env FLOTILLA_DECODE_FP8_LEAN=1 $PYTEST -m gpu \
        $R/tests/kernels/test_fp8_kv_cache.py -k "streams_over_heads or transposed_streams" ;;
    summary) python3 - $OUT > $OUT/summary.txt <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["# kvfp8 summary (issue 22: fp8-KV step <= 0.70x bf16 KV at bs64 x ctx 4,096; s23 H200: 0.760x)"]
try:
    rows = [r for r in json.load(open(out / "sweep.json"))["cases"] if "us" in r]
except (OSError, ValueError, KeyError):
    rows = []
def name(r):
    if r["pool"].startswith("bf16"):
        return r["pool"]
    lean = " lean" if r.get("lean") else ""
    return f"{r['pool']} {r['form']} {r['block_n']}/{r['num_warps']}/{r['num_stages']}{lean}"
for r in rows:
    lines.append(f"KERNEL {name(r):40s} {r['us']:7.1f} us {r['gbps']:6.0f} GB/s err {r['rel_err']:.1e}")
main = next((r for r in rows if r["pool"] == "fp8_cvtpx" and not r.get("lean")), None)
lean = [r for r in rows if r.get("lean") and not r.get("table")]
if main and lean:
    best = min(lean, key=lambda r: r["us"])
    lines.append(f"KERNEL best lean {name(best)} {best['us']:.1f} us = {best['us'] / main['us']:.3f}x the default's "
                 f"{main['us']:.1f}")
verdict = "no step measured"
try:
    ab = json.load(open(out / "step.json"))["bs64ab"]
    ratio = ab["b_ms"] / ab["a_ms"]
    lines.append(f"STEP bs64 x 4,096 fp8 KV, one engine A B B A: A {ab['a_spec']} {ab['a_ms']:.3f} ms, B {ab['b_spec']} "
                 f"{ab['b_ms']:.3f} ms = {ratio:.3f}x A; vs s23's bf16-KV 12.150 ms: A {ab['a_ms'] / 12.150:.3f}x, "
                 f"B {ab['b_ms'] / 12.150:.3f}x")
    launch, wave, *_ = ab["b_spec"].split("@")
    verdict = (f"B wins ({ratio:.3f}x): set FLOTILLA_DECODE_FP8_LEAN's default on (`_fp8_lean_env`) and _FP8_LAUNCH to "
               f"{launch} (wave {wave})" if ratio < 0.99 else f"B not faster ({ratio:.3f}x): keep the default off")
except (OSError, ValueError, KeyError) as exc:
    lines.append(f"STEP: no A/B ({exc!r})")
lines.append(f"VERDICT: {verdict}")
print("\n".join(lines))
PY
      cat $OUT/summary.txt $L > $OUT/kvfp8.log; cat $OUT/summary.txt ;;
  esac
done

source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
# Issue 22's fp8-KV floor on the H200, one call (BUDGET_S, default 240 s of device time): with --kv-cache-dtype fp8 the
# decode step at batch 64 x context 4,096 (Llama-3.1-8B shape, bf16 weights) <= 0.70x the bf16-KV step (main:
# 9.483 vs 12.571 ms = 0.754x, session 12). Branch kv15: form "h<N>" of the paged decode kernel
# (kernels/triton_paged_decode.py `_attend_heads_t` with KS key streams a head): a program covers N neighbouring KV
# heads with key_streams / N interleaved key streams a head, so that one split is 64 x 8 / N programs whose warps ask
# for a key's N heads (N x 128 contiguous bytes of the fp8 pool, as a bf16 head's 256) in the same iteration, at
# main's 8 warps an SM. Main's form t reads 128 bytes a (token, head) at a 1 KB stride and reaches ~4.0 TB/s against
# the bf16 kernel's ~4.4 (s11 call 4: 134.7 vs 244.9 us). Default off: FLOTILLA_DECODE_FP8_LAUNCH /
# FLOTILLA_DECODE_WAVE select it (docs/quantization.md, session 15).
# Stages, each under its own limit (capped by what is left):
#   sweep    bench/fp8_kv_decode.py --batches 64 --workers 8 (limit 45 s; 17 rows compiled in 8 processes first):
#            the attention kernel at 64 x 4,096 in one process: bf16 pool (default), fp8 pool main's default (t
#            32/2/4, 1 split), then kv15's grid (fp8_kv_decode.KV15_GRID: h2 32/4 at 4/6/3/5 stages, t 32/2 at 6/5
#            stages, h2 64/4/3, h2 64/8/2, h4 32/8/4, h 16/2/3 and 32/2/3 at 2 splits; h2/h4 at 1 split), then bf16
#            and main / h2 32/4/4 / h2 32/4/6 on a table of consecutive pages (pool *_seq: a fresh engine's pages are
#            consecutive, the sweep's others shuffled). us, GB/s (each pool's own bytes) and rel_err per row.
#   fp8new   bench/decode_ab.py --kv-cache-dtype fp8 --context 4096 --batch-sizes 64 (limit 100 s; own process) at
#            the sweep's fastest new row (not main's; pool fp8_cvtpx): FLOTILLA_DECODE_FP8_LAUNCH=<launch>,
#            FLOTILLA_DECODE_WAVE=<wave giving the row's splits at batch 64 on 132 SMs>. KV15_LAUNCH="launch@wave"
#            overrides; fallback 32,4,4,cvtpx,4h2@2. Then its per-kernel profile at batch 64 (8 steps: attention
#            us a layer in the engine at 64 rows, never measured before; the step figure is saved before it).
#   fp8main  the same, main's default (both variables unset; limit 100 s; profiled only when >= 200 s are left: at 75 s its profile ran past the limit on an H100, session 19).
#   bf16     the same with bf16 KV (only when >= 55 s are left; else the summary quotes session 12's 12.571 ms).
#   tests    the GPU test of kv15's launches (h2 / h4 / h at 1-2 splits) at Llama heads in CUDA graphs (test_fp8_kv_cache.py
#            test_cuda_fp8_streams_over_heads_and_keys_at_llama_heads; only when >= 30 s are left).
#   summary  (always) the block at the top of kv15.log: kernel us / GB/s (bf16, fp8 main, fp8 new, best of the sweep),
#            step ms of the three sides and the fp8/bf16 ratios (target <= 0.70), attention us a layer from the
#            profiles, greedy tokens compared (fp8 new vs fp8 main; the lone 32-token prompt's 16 tokens), and a
#            VERDICT line saying what to merge.
# Output: $OUT/kv15.log (read first: summary block, then every stage's lines), $OUT/kv15.json (sweep rows, the
# sides' JSON, summary), $OUT/kv15-sides.log (the sides' and tests' output tails).
# Run from the repository root (a `git archive` of branch kv15), carrying .whl (pydantic stack) as the others:
#   OUT=... BUDGET_S=240 bash bench/results/kv15-gpu.sh
# The engine A/B alone at a given launch (no sweep), ~200 s:
#   KV15_LAUNCH=32,4,4,cvtpx,4h2@2 STAGES="fp8new fp8main bf16 summary" BUDGET_S=220 bash bench/results/kv15-gpu.sh
export OMP_NUM_THREADS=1
L=$OUT/kv15.log; W=/tmp/kv15w; S=$OUT/kv15-sides.log; rm -rf $W; mkdir -p $W; : > $W/body.log; : > $S
log() { tee -a $W/body.log; }
side() {  # label limit profile_when_left [env...]: one decode_ab.py engine side (its own process)
  local label=$1 limit=$2 pwhen=$3; shift 3
  local prof=""; [ $((END - SECONDS)) -ge $pwhen ] && prof=64
  echo "$label: env ${*:-(none)}; profile ${prof:-skipped}" | log
  env -u FLOTILLA_DECODE_FP8_LAUNCH -u FLOTILLA_DECODE_WAVE -u FLOTILLA_DECODE_FUSED_MERGE "$@" \
    timeout $(left $limit) python3 $R/bench/decode_ab.py --label $label --context 4096 --batch-sizes 64 \
    --profile-batch-sizes "$prof" --profile-steps 8 --token-batch 1 --tokens 16 --json $W/$label.json \
    $KVARG > $W/$label.log 2>&1
  echo "rc=$?" | log
  grep -E "^$label:|Error|error" $W/$label.log | tail -4 | cut -c1-300 | log
  { echo "--- $label"; grep -vE "Warning|warn|runs eagerly" $W/$label.log | tail -25 | cut -c1-300; } >> $S
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | log
for s in ${STAGES:-sweep fp8new fp8main bf16 tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | log
  [ $s != summary ] && [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | log; continue; }
  case $s in
    sweep) timeout $(left 45) python3 $R/bench/fp8_kv_decode.py --json $W/sweep.json --batches 64 --workers 8 \
        > $W/sweep.log 2>&1
      echo "rc=$?" | log
      grep -vE "Warning|warn" $W/sweep.log | cut -c1-260 | log ;;
    fp8new) mine=$(python3 - $W/sweep.json <<'PY'
import json, os, sys
if os.environ.get("KV15_LAUNCH"):
    print(os.environ["KV15_LAUNCH"]); sys.exit()
try:
    rows = [r for r in json.load(open(sys.argv[1]))["cases"] if r.get("pool") == "fp8_cvtpx" and "us" in r
            and max(r.get("rel_err", 1), r.get("rel_err_after", 1)) < 0.1 and not r.get("fused_merge")
            and (r.get("form"), r.get("block_n"), r.get("num_warps"), r.get("num_stages"), r.get("num_splits"))
            != ("t", 32, 2, 4, 1)]
except (OSError, ValueError, KeyError):
    rows = []
if not rows:
    print("32,4,4,cvtpx,4h2@2"); sys.exit()
r = min(rows, key=lambda r: r["us"])
form = r.get("form") or ""
heads = (int(form[1:]) if form[1:] else r["key_streams"]) if form.startswith("h") else 1
programs = 64 * (8 // heads)  # batch 64 x Llama's 8 KV heads / the heads a program covers
wave = -(-r.get("num_splits", 1) * programs // 132)  # default_num_splits: wave x 132 // programs = the splits
print(f"{r['block_n']},{r['num_warps']},{r['num_stages']},cvtpx,{r['key_streams']}{form}@{wave}")
PY
)
      echo "$mine" > $W/mine.txt
      IFS=@ read -r launch wave <<< "$mine"
      KVARG="--kv-cache-dtype fp8" side fp8new 100 0 FLOTILLA_DECODE_FP8_LAUNCH=$launch FLOTILLA_DECODE_WAVE=$wave ;;
    fp8main) KVARG="--kv-cache-dtype fp8" side fp8main 100 200 ;;
    bf16) [ $((END - SECONDS)) -lt 55 ] && { echo "skipped: < 55 s left (summary quotes session 12's)" | log; continue; }
      KVARG="" side bf16 70 100000 ;;
    tests) [ $((END - SECONDS)) -lt 30 ] && { echo "skipped: < 30 s left" | log; continue; }
      timeout $(left 45) python3 -m pytest $R/tests/kernels/test_fp8_kv_cache.py -m gpu -q -p no:cacheprovider \
        -k "streams_over_heads_and_keys_at_llama" -c $R/pyproject.toml --rootdir=$R > $W/tests.log 2>&1
      echo "rc=$?" | log
      grep -E "Error|error:|passed|failed|FAILED" $W/tests.log | tail -6 | cut -c1-300 | log
      { echo "--- tests"; tail -30 $W/tests.log | cut -c1-300; } >> $S ;;
    summary) MINE=$(cat $W/mine.txt 2>/dev/null) python3 - $W > $W/summary.txt 2>&1 <<'PY'
import json, os, re, sys
w, out = sys.argv[1], os.environ.get("OUT", "/tmp/out")
S12_BF16 = 12.571  # session 12's bf16-KV step at bs64 x ctx 4,096 (main's figure; used only if this call has none)
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        return {"error": repr(e)[:200]}
sweep, sides = load(f"{w}/sweep.json"), {s: load(f"{w}/{s}.json") for s in ("fp8new", "fp8main", "bf16")}
mine = os.environ.get("MINE") or "?"
lines = [f"# kv15 summary (issue 22 fp8-KV floor: step <= 0.70x bf16 KV at bs64 x ctx 4,096); fp8 new = {mine} "
         "(FLOTILLA_DECODE_FP8_LAUNCH@FLOTILLA_DECODE_WAVE)"]
cases = [c for c in sweep.get("cases", []) if c.get("batch") == 64]
def key(c):
    return (c.get("form"), c.get("block_n"), c.get("num_warps"), c.get("num_stages"), c.get("num_splits", 1))
def name(c):
    if c.get("pool", "").startswith("bf16"):
        return c["pool"]
    return f"{c['pool']} {c.get('block_n')},{c.get('num_warps')},{c.get('num_stages')},{c.get('key_streams')}" \
           f"{c.get('form', '')}@{c.get('num_splits', 1)}split"
ok = [c for c in cases if "us" in c and max(c.get("rel_err", 1), c.get("rel_err_after", 1)) < 0.1]
launch = mine.split("@")[0].split(",")
field = re.fullmatch(r"(\d+)(t|h\d*)?", launch[4]) if len(launch) == 5 else None
streams, form = (int(field.group(1)), field.group(2) or "") if field else (0, "?")
new_key = None
for c in ok:  # the sweep's row of the launch fp8new ran (its splits as the sweep had them)
    if c.get("pool") == "fp8_cvtpx" and field and (c.get("form"), c.get("block_n"), c.get("num_warps"),
                                                    c.get("num_stages")) == (form, *map(int, launch[:3])):
        new_key = key(c)
        break
pick = {"bf16": next((c for c in ok if c.get("pool") == "bf16"), None),
        "fp8 main": next((c for c in ok if c.get("pool") == "fp8_cvtpx" and key(c) == ("t", 32, 2, 4, 1)), None),
        "fp8 new": next((c for c in ok if c.get("pool") == "fp8_cvtpx" and key(c) == new_key), None)}
lines.append("KERNEL bs64 x 4,096 (bench/fp8_kv_decode.py, shuffled pages): " + "; ".join(
    f"{k} {c['us']:.1f} us {c['gbps']:.0f} GB/s" if c else f"{k} -" for k, c in pick.items()))
if pick["fp8 main"] and pick["fp8 new"]:
    floor = f" (fp8 bytes at the bf16 row's GB/s: {pick['bf16']['us'] / 2:.1f} us)" if pick["bf16"] else ""
    lines.append(f"KERNEL fp8 new / main = {pick['fp8 new']['us'] / pick['fp8 main']['us']:.3f}x{floor}")
seq_rows = [c for c in ok if c.get("pool", "").endswith("_seq")]
if seq_rows:  # the same launches on consecutive pages (a fresh engine's layout)
    lines.append("KERNEL consecutive pages: " + "; ".join(f"{name(c)} {c['us']:.1f} us {c['gbps']:.0f} GB/s"
                                                          for c in seq_rows))
for c in sorted(ok, key=lambda c: c["us"])[:8]:
    lines.append(f"  sweep {c['us']:7.1f} us {c['gbps']:5.0f} GB/s err {c['rel_err']:.1e}  {name(c)}")
for c in cases:
    if "error" in c:
        lines.append(f"  sweep ERROR {name(c)}: {c['error'][:120]}")
step = {}
for s, r in sides.items():
    lat = (r.get("latency") or [{}])[0]
    if lat.get("ms_per_step"):
        step[s] = lat["ms_per_step"]
bf16 = step.get("bf16")
base, base_src = (bf16, "this call") if bf16 else (S12_BF16, "session 12, NOT this call")
parts = []
for s in ("fp8new", "fp8main", "bf16"):
    if s in step:
        lat = sides[s]["latency"][0]
        ratio = f" = {step[s] / base:.3f}x" if s != "bf16" else ""
        parts.append(f"{s} {step[s]:.3f} ms{ratio} (graphed {lat.get('graphed_steps')}/{lat.get('steps')}, "
                     f"rows at end {lat.get('running_at_end')})")
    else:
        parts.append(f"{s} - ({sides[s].get('error', 'no latency row')[:60]})")
lines.append(f"STEP bs64 x ctx 4,096 (bf16 KV base {base:.3f} ms, {base_src}): " + "; ".join(parts))
for s in ("fp8new", "fp8main"):
    for p in sides[s].get("profiles", []):
        att = p.get("groups_us_per_step", {}).get("attention")
        if att:
            lines.append(f"PROFILE {s}: attention {att / 32:.1f} us a layer at {p.get('running_rows')} rows; "
                         f"wall {p.get('wall_us_per_step', 0):.0f} us, busy {p.get('gpu_busy_us_per_step', 0):.0f}, "
                         f"idle {p.get('idle_us_per_step', 0):.0f} a step; groups "
                         + str({g: round(v) for g, v in p.get("groups_us_per_step", {}).items()}))
tok = {s: sides[s].get("tokens") for s in sides}
if tok["fp8new"] and tok["fp8main"]:
    a, b = tok["fp8new"][0], tok["fp8main"][0]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    lines.append("TOKENS fp8 new vs fp8 main: " + ("identical" if a == b else f"differ from position {same}")
                 + f" ({len(a)} tokens of a 32-token prompt)")
verdict = "VERDICT: no engine figure for fp8 new and main in this call"
if "fp8new" in step and "fp8main" in step:
    gain = step["fp8new"] / step["fp8main"]
    if gain <= 0.98:  # two engines in turn: ~1-2 % apart at the same launch (s11 call 4's phases)
        wave = mine.split("@")[1] if "@" in mine else None
        verdict = (f"VERDICT: fp8 new {gain:.3f}x main's fp8 step: MERGE kv15 and set _FP8_LAUNCH = ({launch[0]}, "
                   f"{launch[1]}, {launch[2]}, 'cvtpx', {streams}), _FP8_FORM = {form!r}, _FP8_WAVE = {wave} "
                   "(kernels/triton_paged_decode.py)")
    elif gain < 1.0:
        verdict = (f"VERDICT: fp8 new {gain:.3f}x main's fp8 step: within the two engines' noise (0.98-1.0x); "
                   f"rerun the engine sides (STAGES=\"fp8new fp8main bf16 summary\" KV15_LAUNCH={mine}) before merging")
    else:
        verdict = f"VERDICT: fp8 new {gain:.3f}x main's fp8 step: no gain; keep main's default"
    verdict += f"; floor 0.70x: fp8 new {step['fp8new'] / base:.3f}x ({'MET' if step['fp8new'] / base <= 0.70 else 'missed'})"
lines.append(verdict)
summary = "\n".join(x for x in lines if x)
json.dump({"summary": summary, "mine": mine, "sweep": sweep, "sides": sides}, open(f"{out}/kv15.json", "w"), indent=1)
print(summary)
PY
      cat $W/summary.txt | log ;;
  esac
  { cat $W/summary.txt 2>/dev/null; echo; cat $W/body.log; } > $L  # summary block on top, rewritten each stage
done
echo "=== done $(date +%T)" | log
{ cat $W/summary.txt 2>/dev/null; echo; cat $W/body.log; } > $L

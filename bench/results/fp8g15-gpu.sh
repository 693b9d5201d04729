source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
# Issue 22's fp8 floor on the H200 (branch fp8g15), one call, BUDGET_S (default 240 s) of device time: fp8 decode
# (`--quantization fp8`: W8A16 at one row) at batch 1 x context 512, Llama-3.1-8B shape, random weights; main 3.171
# ms/step = 0.72x today's bf16 4.395 (BF16_MS); the floor is 0.62x (<= ~2.72 ms). The lever is
# kernels/triton_fp8_row_gemv.py (FLOTILLA_FP8_ROW_GEMV=1, default off): a register-pipelined one-row fp8 GEMV (the
# weight read as int32 words, inline-PTX e4m3 -> f32, 2-D accumulator: ~200 instead of 318 SASS instructions per 64
# weight bytes a thread under Triton 3.6), launched by PDL with its first tiles loaded before the wait, a gated
# form (gate/up + SiLU-and-mul in one launch) in the fp8 MLP and a rope form (qkv + rotary + KV write in one
# launch) in the attention. Stages, each under its own limit (capped by what is left):
#   micro   (70 s) bench/fp8_row_gemv.py: per projection (qkv, o_proj, gate/up, down) at one row, main's fp8 GEMV
#           ("old"; + the SiLU kernel for gate/up) vs the row GEMV plain ("new") and by PDL ("new_pdl"), us and TB/s
#           (ROW lines), then a 10-config sweep by PDL (SWEEP), the best per shape (BEST) and the engine config
#           (CONFIGS: the shapes whose best beat the default by > 1 %; FP8G15_CONFIG=... overrides, "default" none);
#           LAYER: the four projections back to back in one graph, main's kernels vs the row GEMV by PDL (default,
#           best), us a layer and x32 layers (the projections' share of a step, without attention and norms).
#   main    (55 s) bench/decode_ab.py --quantization fp8, FLOTILLA_FP8_ROW_GEMV=0 (main's path): 24 greedy tokens of
#           one prompt alone (batch 1), ms/step at batch 1 x ctx 512 (graphed), a bs1 kernel profile (under PDL its
#           times are unusable, busy > wall: only kernel names and launch counts are read).
#   new     (60 s) the same with FLOTILLA_FP8_ROW_GEMV=1 and the micro stage's FLOTILLA_FP8_ROW_GEMV_CONFIG.
#   tests   (40 s, only if >= 50 s are left) tests/kernels/test_fp8_row_gemv.py compiled on the GPU, the cases that
#           matter there (FP8G15_TESTS, a -k expression; "" for all): Llama shapes vs the reference and main's GEMV
#           (plain, PDL), a PDL chain in a CUDA graph bit-equal to plain launches, every e4m3 code by the PTX cvt,
#           the rope form bit-equal to the plain kernel + rotary_and_write_kv.
#   main2   (55 s, only if >= 60 s are left) main's side again: the spread main/main2 is the A/B's noise.
#   norope  (not in the default list; STAGES=... to add it) the new side without the qkv rope form
#           (FLOTILLA_QKV_ROPE=0: the row GEMV for qkv, then main's rotary + KV-write kernel): attribution.
#   summary the DECISION lines (always runs), put at the top of the log.
# Output (3 files): $OUT/fp8g15-gpu.log (read first), $OUT/fp8g15-gpu.json (summary + the engine JSONs),
# $OUT/fp8g15-gemv.json (micro stage). Run from the repository root on the H200 machine, carrying .whl:
#   OUT=... BUDGET_S=240 bash bench/results/fp8g15-gpu.sh          (STAGES="main new summary": the engine A/B alone)
L=$OUT/fp8g15-gpu.log; W=/tmp/fp8g15w; mkdir -p $W
rm -f $W/*.json $W/*.log $W/best.txt $W/decision.txt $W/new-config.txt $W/log.tmp
side() {  # label limit env...
  local label=$1 lim; lim=$(left $2); shift 2
  echo "--- $label $(date +%T) limit $lim s: $*" | tee -a $L
  env "$@" timeout $lim python3 $R/bench/decode_ab.py --label $label --quantization fp8 --batch-sizes 1 \
    --profile-batch-sizes 1 --profile-steps 8 --token-batch 1 --context 512 --json $W/$label.json > $W/$label.log 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "^$label:|Error|error" $W/$label.log | grep -v Warning | tail -6 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-micro main new tests main2 summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    micro) timeout $(left 70) python3 $R/bench/fp8_row_gemv.py --json $OUT/fp8g15-gemv.json --configs-out $W/best.txt \
        > $W/micro.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^(ROW|SWEEP|BEST|CONFIGS|LAYER|compile|skipped)|Error|error" $W/micro.log | cut -c1-300 | tee -a $L ;;
    main) side main 55 FLOTILLA_FP8_ROW_GEMV=0 ;;
    new) cfg=$(head -1 $W/best.txt 2>/dev/null); cfg=${FP8G15_CONFIG:-$cfg}; [ "$cfg" = default ] && cfg=""
      echo "FLOTILLA_FP8_ROW_GEMV=1 FLOTILLA_FP8_ROW_GEMV_CONFIG=${cfg}" > $W/new-config.txt
      side new 60 FLOTILLA_FP8_ROW_GEMV=1 FLOTILLA_FP8_ROW_GEMV_CONFIG=$cfg ;;
    tests) if [ $((END - SECONDS)) -lt 50 ]; then echo "skipped: kept for the summary" | tee -a $L; continue; fi
      timeout $(left 40) python3 -m pytest $R/tests/kernels/test_fp8_row_gemv.py -q -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R -k "${FP8G15_TESTS:-llama_shapes or pdl_chain or e4m3 or rope_form_equals}" \
        > $W/tests.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "Error|error:|passed|failed|FAILED" $W/tests.log | tail -8 | cut -c1-300 | tee -a $L ;;
    main2) if [ $((END - SECONDS)) -lt 60 ]; then echo "skipped: kept for the summary" | tee -a $L; continue; fi
      side main2 55 FLOTILLA_FP8_ROW_GEMV=0 ;;
    norope) if [ $((END - SECONDS)) -lt 60 ]; then echo "skipped: kept for the summary" | tee -a $L; continue; fi
      side norope 55 FLOTILLA_FP8_ROW_GEMV=1 FLOTILLA_QKV_ROPE=0 FLOTILLA_FP8_ROW_GEMV_CONFIG=$(head -1 $W/best.txt 2>/dev/null) ;;
    summary) BF16_MS=${BF16_MS:-4.395} python3 - $W $OUT <<'PY' 2>&1 | tee $W/decision.txt
import json, os, sys
w, out = sys.argv[1], sys.argv[2]
bf16 = float(os.environ["BF16_MS"])
sides = {}
for label in ("main", "new", "main2", "norope"):
    try:
        sides[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as exc:
        sides[label] = {"error": repr(exc)[:200]}
ms = {l: r["ms_per_step"] for l, s in sides.items() for r in s.get("latency", []) if r.get("batch") == 1}
summary = {"ms_per_step_bs1": ms, "bf16_ms": bf16, "floor": 0.62}
for l in ("main", "new", "main2", "norope"):
    if l not in ms and "error" in sides[l] and l in ("main2", "norope"):
        continue  # an optional side that did not run
    if l in ms:
        print(f"STEP fp8 {l}: {ms[l]:.3f} ms = {ms[l] / bf16:.3f}x bf16 {bf16} (floor 0.62: "
              f"{'MET' if ms[l] <= 0.62 * bf16 else 'not met'}, <= {0.62 * bf16:.3f} ms)")
    else:
        print(f"STEP fp8 {l}: n/a ({sides[l].get('error', 'no bs1 latency')})"[:300])
if "main" in ms and "new" in ms:
    summary["new/main"] = ms["new"] / ms["main"]
    print(f"STEP new/main: {ms['new'] / ms['main']:.4f} ({ms['main']:.3f} -> {ms['new']:.3f} ms, "
          f"{ms['new'] - ms['main']:+.3f} ms)" + (f"; main/main2 spread {ms['main2'] / ms['main']:.4f}" if "main2" in ms else ""))
try:
    summary["new_config"] = open(f"{w}/new-config.txt").read().strip()
except OSError:
    summary["new_config"] = None
print(f"CONFIG new: {summary['new_config']}")
ta, tb = sides["main"].get("tokens"), sides["new"].get("tokens")
if ta and tb:
    a, b = ta[0], tb[0]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    summary["greedy_equal_prefix"] = f"{first}/{len(a)}"
    print(f"GREEDY new vs main (batch-1 prompt, random weights): " + ("identical" if a == b else
          f"first {first}/{len(a)} tokens equal (the row GEMV sums K in another order: expected to drift)"))
else:
    print("GREEDY: n/a")
for label, s in sides.items():
    for p in s.get("profiles", []):
        names = {k["name"]: k for k in p.get("kernels", [])}
        def n(kname):
            return sum(v["launches_per_step"] for k, v in names.items() if k.startswith(kname))
        counts = ", ".join(f"{k} x{n(k):.0f}" for k in ("_fp8_row_gemv_kernel", "_fp8_row_gemv_rope_kernel",
                                                         "_gemv_kernel", "_silu_and_mul_kernel", "_rotary_kv_write_kernel"))
        print(f"PROFILE {label} bs1: {p['launches_per_step']:.0f} launches/step; {counts}; wall "
              f"{p['wall_us_per_step']:.0f} us (kernel times unusable under PDL)")
try:
    g = json.load(open(f"{out}/fp8g15-gemv.json"))
    tot = {"old": 0.0, "new": 0.0, "new_pdl": 0.0, "best": 0.0}
    for name, r in g.get("shapes", {}).items():
        cells = []
        complete = all("us" in r.get(t, {}) for t in ("old", "new", "new_pdl"))  # totals over complete shapes only
        for t in ("old", "new", "new_pdl"):
            v = r.get(t, {})
            if "us" in v:
                tot[t] += v["us"] if complete else 0.0
                cells.append(f"{t} {v['us']:.2f} us {v['tbps']:.2f} TB/s" + ("" if v.get("ok") else " FAILED"))
            else:
                cells.append(f"{t} {v.get('error', 'n/a')[:80]}")
        b = r.get("best")
        if b:
            cells.append(f"best {b['config']} {b['us']:.2f} us")
        if complete:
            tot["best"] += min(b["us"], r["new_pdl"]["us"]) if b else r["new_pdl"]["us"]
        print(f"KERNEL {name} ({r['rows']}x{r['k']}{', gated + SiLU' if r['gated'] else ''}): " + " | ".join(cells))
    if all(tot.values()):
        print(f"KERNEL per layer (4 shapes): old {tot['old']:.1f} us, new {tot['new']:.1f}, new_pdl {tot['new_pdl']:.1f}, "
              f"best {tot['best']:.1f}; x32 layers: new_pdl - old = {32 * (tot['new_pdl'] - tot['old']) / 1000:+.3f} ms/step, "
              f"best - old = {32 * (tot['best'] - tot['old']) / 1000:+.3f}")
    lay = g.get("layers") or {}
    if lay.get("old"):
        print("LAYER (the 4 projections back to back in one graph, us a layer, x32): " + " | ".join(
            f"{k} {v:.1f} us = {32 * v / 1000:.3f} ms/step" for k, v in lay.items() if v)
            + (f"; new_pdl - old = {32 * (lay['new_pdl'] - lay['old']) / 1000:+.3f} ms/step" if lay.get("new_pdl") else ""))
    summary["kernels"] = g.get("shapes")
    summary["layers"] = lay
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(f"KERNEL n/a: {exc!r}"[:200])
summary["sides"] = sides
json.dump(summary, open(f"{out}/fp8g15-gpu.json", "w"), indent=1)
PY
      # the decision lines first in the log, then the stages as they ran
      { echo "=== DECISION (summary stage; fp8g15; merge + flip FLOTILLA_FP8_ROW_GEMV on if STEP new/main < 1 beyond the"
        echo "    main/main2 spread, the KERNEL lines pass their checks and the tests stage passed)"
        cat $W/decision.txt; cat $L; } > $W/log.tmp && cp $W/log.tmp $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
# int4g15 (issue 22's int4 floor: W4A16 decode bs1 ctx512 <= 0.45x bf16; main 3.438 ms = 0.765x): where the int4
# batch-1 step's time goes, and two levers on the wide int4 GEMV, both default off: a launch by PDL with its first
# step's weights loaded before griddepcontrol.wait (FLOTILLA_INT4_WIDE_PDL) and the [rows, words] word tile with PTX
# scale loads (tile knob layout=1: 449 instead of 735 sm_90 instructions a step under Triton 3.6, the layout session
# 10 found and never measured). One H200 call, BUDGET_S (default 240 s). From the
# repository root (a `git archive` of branch int4g15), carrying .whl as the other scripts:
#   OUT=... BUDGET_S=240 bash bench/results/int4g15-gpu.sh
# Stages (STAGES="eng kern tests bf16 summary" by default; each under `timeout $(left N)`; JSON written as it goes):
#   warm   (background, from the start) bench/int4_wide_pdl.py --warm-only: the PDL variants' kernels compiled into
#          Triton's cache by 8 processes while the engine starts (its variants then load instead of compiling)
#   eng    (150 s) bench/int4_step_ab.py: ONE W4A16 engine (/tmp/llama8b-w4a16 from w4a16-model.sh, ~55 s start-up):
#          per-kernel profile of main's bs1 ctx512 step with FLOTILLA_PDL off (kernel times and the idle gaps between
#          them; the int4 GEMVs per projection), the same with PDL on, then the step A/B main / rows / top / late /
#          top_rows / late_rows / top_rows_w256 (order v1..v7 v7..v1, graphs recaptured per phase; rows = layout=1,
#          top/late = FLOTILLA_INT4_WIDE_PDL=1/late, w256 = 256 words a step), greedy tokens per variant, and the
#          fastest variant's profile (PDL on)
#   kern   (75 s, if >= 40 s left) bench/int4_wide_pdl.py: per projection alone / after RMSNorm, and the layer chain
#          (norm, qkv, norm, o, norm, gate_up, SiLU, down), main vs 14 launch variants (most telling first: a cut run
#          keeps them); BEST_MODE / PDL_CONFIG / PLAIN_CONFIG lines
#   tests  (30 s, if >= 35 s left) tests/kernels/test_int4_wide_pdl.py on the GPU (compiled kernels, real PDL: the peel
#          bit-equal to the plain launch, layout 1 against the reference, the PDL chain in a CUDA graph)
#   bf16   (45 s, if >= 50 s left) the bf16 engine's bs1 ctx512 step (the ratio's denominator; else session 14's 4.395)
#   summary the block at the top of int4g15.log (always runs)
# Outputs (4): int4g15.log (read first: summary, then each stage's lines), int4g15-detail.log (every process's
# output), int4g15-step.json (engine: profiles, tokens, A/B), int4g15-kern.json (microbenchmark).
L=$OUT/int4g15-stages.log D=$OUT/int4g15-detail.log
: > $L; : > $D
source $R/bench/results/w4a16-model.sh  # /tmp/llama8b (bf16) and /tmp/llama8b-w4a16 (by $R: we are in /tmp)
python3 $R/bench/int4_wide_pdl.py --warm-only --warm-jobs 8 --json /tmp/int4g15-warm.json > /tmp/int4g15-warm.log 2>&1 &
WARM=$!
for s in ${STAGES:-eng kern tests bf16 summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  case $s in
    eng) timeout $(left 150) python3 $R/bench/int4_step_ab.py --model /tmp/llama8b-w4a16 \
           --json $OUT/int4g15-step.json > /tmp/int4g15-eng.log 2>&1
      echo "rc=$?" | tee -a $L
      { echo "--- eng"; cat /tmp/int4g15-eng.log; } >> $D
      grep -E "^startup|^PROFILE|^    |^tokens|^  phase|^AB|Error|error" /tmp/int4g15-eng.log | cut -c1-300 | tee -a $L ;;
    kern) [ $((END - SECONDS)) -lt 40 ] && { echo "skipped: under 40 s left" | tee -a $L; continue; }
      wait $WARM 2>/dev/null && wj=0 || wj=8  # compiled in the background already: no second warm-up
      { echo "--- warm"; cat /tmp/int4g15-warm.log; } >> $D
      timeout $(left 75) python3 $R/bench/int4_wide_pdl.py --warm-jobs $wj --json $OUT/int4g15-kern.json \
        > /tmp/int4g15-kern.log 2>&1
      echo "rc=$?" | tee -a $L
      { echo "--- kern"; cat /tmp/int4g15-kern.log; } >> $D
      grep -vE "Warning|warn" /tmp/int4g15-kern.log | tail -32 | cut -c1-330 | tee -a $L ;;
    tests) [ $((END - SECONDS)) -lt 35 ] && { echo "skipped: under 35 s left" | tee -a $L; continue; }
      timeout $(left 30) python3 -m pytest $R/tests/kernels/test_int4_wide_pdl.py \
        -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R > /tmp/int4g15-tests.log 2>&1
      echo "rc=$?" | tee -a $L
      { echo "--- tests"; cat /tmp/int4g15-tests.log; } >> $D
      grep -E "Error|error:|passed|failed" /tmp/int4g15-tests.log | tail -8 | tee -a $L ;;
    bf16) [ $((END - SECONDS)) -lt 50 ] && { echo "skipped: under 50 s left (ratio vs session 14's 4.395 ms)" | tee -a $L; continue; }
      timeout $(left 45) python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name bf16 --jobs bs1 --max-num-seqs 4 \
        --json /tmp/int4g15-bf16.json > /tmp/int4g15-bf16.log 2>&1
      echo "rc=$?" | tee -a $L
      { echo "--- bf16"; cat /tmp/int4g15-bf16.log; } >> $D
      grep -E "Error|error" /tmp/int4g15-bf16.log | tail -3 | tee -a $L ;;
    summary) python3 - $OUT/int4g15-step.json $OUT/int4g15-kern.json /tmp/int4g15-bf16.json > /tmp/int4g15-summary.txt 2>&1 <<'PY'
import json, sys


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        return {"error": f"{path}: {e}"}


step, kern, bf16 = (load(p) for p in sys.argv[1:4])
bf16_ms = (bf16.get("bs1") or {}).get("ms_per_step")
bf16_src = "this call" if bf16_ms else "session 14 (not measured here)"
bf16_ms = bf16_ms or 4.395
print(f"SUMMARY int4g15 (H200: {step.get('device', '?')}); bf16 bs1 ctx512 {bf16_ms:.3f} ms ({bf16_src}); "
      f"issue-22 floor 0.45x = {0.45 * bf16_ms:.3f} ms")
if "error" in step:
    print("  engine:", step["error"])
print(f"  engine start-up {step.get('startup_s', 0):.1f} s; int4 paths {step.get('int4_paths')}")
for label in ("profile_pdl_off", "profile_main", "profile_best"):
    p = step.get(label)
    if not p:
        print(f"  {label}: not measured")
        continue
    k = {r["key"]: r for r in p["kernels"]}
    gemv = sum(r["us_per_step"] for key, r in k.items() if key.startswith("int4 GEMV"))
    gaps = sum(r["gap_before_us_per_step"] for r in p["kernels"])
    print(f"  {label}{' (' + p['variant'] + ')' if 'variant' in p else ''}: wall {p['wall_us_per_step']:.0f} us/step = "
          f"kernels {p['busy_us_per_step']:.0f} (union {p['union_us_per_step']:.0f}) + idle inside "
          f"{p['idle_inside_us_per_step']:.0f} + between steps {p['idle_between_us_per_step']:.0f}; "
          f"{p['launches_per_step']:.0f} launches; int4 GEMVs {gemv:.0f} us ({gemv / max(p['busy_us_per_step'], 1):.0%} of"
          f" kernel time), gaps before kernels {gaps:.0f} us")
    for proj in ("qkv", "o", "gate_up", "down"):
        r = k.get(f"int4 GEMV {proj}")
        if r:
            print(f"      int4 GEMV {proj:8s} mean {r['mean_us']:6.2f} us x{r['launches_per_step']:.0f} = "
                  f"{r['us_per_step']:6.0f} us/step, gap before {r['gap_before_us_per_step'] / max(r['launches_per_step'], 1):5.2f} us each")
    others = [r for r in p["kernels"] if not r["key"].startswith("int4 GEMV")][:8]
    for r in others:
        print(f"      {r['us_per_step']:6.0f} us/step x{r['launches_per_step']:<3.0f} (gap before {r['gap_before_us_per_step']:5.0f}) {r['key'][:70]}")
tokens = step.get("tokens") or {}
if tokens:
    print("  greedy tokens equal to main: " + ", ".join(f"{n} {t == tokens.get('main')}" for n, t in tokens.items()))
ab = step.get("ab")
if ab:
    main = ab["ms_per_step"]["main"]
    print(f"  ENGINE A/B (one engine, {' '.join(ab['order'])}): " + ", ".join(
        f"{n} {ms:.3f} ms ({ms / main:.3f}x main, {ms / bf16_ms:.3f}x bf16)" for n, ms in ab["ms_per_step"].items()))
    by = {}
    for ph in ab["phases"]:
        by.setdefault(ph["name"], []).append(ph["ms_per_step"])
    noise = max((max(v) - min(v) for v in by.values() if len(v) > 1), default=0.0)
    print(f"  noise: the largest gap between a variant's own two phases {noise:.3f} ms")
    if ab.get("failed"):
        print(f"  variants left out (failed to compile/capture): {ab['failed']}")
    best = min(ab["ms_per_step"], key=ab["ms_per_step"].get)
    if best != "main":
        mode, config = step["variants"][best]
        var = "FLOTILLA_INT4_WIDE_PDL_CONFIG" if mode else "FLOTILLA_INT4_GEMV_WIDE_CONFIG"
        env = (f"FLOTILLA_INT4_WIDE_PDL={'1' if mode == 'top' else mode} " if mode else "") + (f"{var}='{config}'" if config else "")
        gain = main - ab["ms_per_step"][best]
        print(f"  VERDICT engine: {best} saves {gain:.3f} ms a step{' (within noise)' if gain <= noise else ''} ({env}); "
              f"tokens equal: {tokens.get(best) == tokens.get('main') if tokens else 'n/a'}")
    else:
        print("  VERDICT engine: no variant beats main's launches")
else:
    print("  engine A/B: not measured")
if "rows" in kern:
    b = kern.get("best") or {}
    m = kern["rows"].get("main", {})
    print(f"  KERNEL chain (no attention): main layer {m.get('layer_us', float('nan')):.1f} us; best {b.get('variant')} "
          f"({b.get('layer_gain_us', float('nan')):+.1f} us a layer); best PDL {b.get('pdl_variant')} "
          f"({b.get('pdl_layer_gain_us', float('nan')):+.1f}); PDL_CONFIG={b.get('config')}; PLAIN_CONFIG={b.get('plain_config')}")
    for proj in ("qkv", "o", "gate_up", "down"):
        cells = [f"{v} {r['alone_us'][proj]:.1f}/{r['after_norm_us'][proj]:.1f}" for v, r in kern["rows"].items()
                 if "alone_us" in r]
        print(f"      {proj:8s} alone/after-norm us: " + ", ".join(cells))
    errs = {v: r.get("rel_err_vs_main_qkv") for v, r in kern["rows"].items() if "alone_us" in r}
    bad = {v: e for v, e in errs.items() if e is None or e > 1e-2}
    print(f"  qkv output vs main's launch (rel err; PDL of main's tile must be 0): {errs}"
          + (f"  ERRORS: {bad}" if bad else ""))
else:
    print("  kernel microbenchmark:", kern.get("error", "not measured"))
PY
      cat /tmp/int4g15-summary.txt ;;
  esac
done
echo "=== done $(date +%T)" >> $L
kill $WARM 2>/dev/null
{ cat /tmp/int4g15-summary.txt 2>/dev/null; echo; cat $L; } > $OUT/int4g15.log && rm -f $L

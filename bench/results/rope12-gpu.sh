#!/bin/bash
# Issue 19's batch-1 floor (bf16 decode, ctx 512, Llama-3.1-8B shape, H200: <= 4.05 ms; main 4.50): rotary + the K/V
# cache write folded into the one-row qkv GEMV's epilogue (FLOTILLA_QKV_ROPE=1, kernels/triton_gemv_rope.py: one launch
# a layer instead of the GEMV + _rotary_kv_write_kernel, ~70-74 us a step in 32 launches plus their gaps) against
# main's path, one call (BUDGET_S, default 200 s). Stages, each under its own limit (capped by what is left):
#   kernel (35 s) bench/gemv_rope.py: correctness first (q and both caches, bf16 and fp8 caches, fused vs the pair, bit
#          for bit, launched by PDL as in the engine), then us per layer in CUDA graphs of 32 layers (weights past L2):
#          the pair, the fused kernel, the plain GEMV alone
#   off    (80 s) bench/decode_ab.py, FLOTILLA_QKV_ROPE=0 (main's path): greedy tokens of 1 prompt, then of 64 prompts
#          decoded together (24 tokens each), ms/step at batch 1 and 64 (ctx 512, graphed), profile at batch 64
#   on     (80 s) the same with FLOTILLA_QKV_ROPE=1, plus a batch-1 profile, only to show which kernels ran
#          (_gemv_rope_kernel x32, no _rotary_kv_write_kernel; its times are not usable under PDL: busy > wall)
#   tests  (only if 30 s are left) tests/kernels/test_gemv_rope.py compiled on the GPU (the PDL peel with griddepcontrol)
#   summary      DECISION lines first (put at the top of rope12.log): bs1 ms/step off/on against 4.05, the lone
#          prompt's tokens equal, the kernel stage's bit-equality and per-layer saving, the default the figures support;
#          then bs64 (unchanged path: noise), the 64-row tokens, profiles
# At most 4 files in $OUT: rope12.log (read first), rope12-{off,on}.json, rope12-sides.log (the stages' output;
# the kernel stage's JSON is printed into rope12.log by the summary and kept in /tmp/rope12-kernel.json).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=200 bash bench/results/rope12-gpu.sh
# STAGES="off on summary" runs a subset; CTX sets the sides' context (default 512).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/rope12.log
S=$OUT/rope12-sides.log
K=/tmp/rope12-kernel.json
rm -f $K  # never a previous run's
side() {  # label limit FLOTILLA_QKV_ROPE json profile-batch-sizes
  local lim; lim=$(left $2)
  echo "--- $1 $(date +%T) limit $lim s" >> $S
  env FLOTILLA_QKV_ROPE=$3 timeout $lim python3 $R/bench/decode_ab.py --label $1 --batch-sizes 1,64 \
    --profile-batch-sizes $5 --token-batch 1,64 --context ${CTX:-512} --json $4 >> $S 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "^$1:|Error|error" $S | grep -v "^--- " | tail -6 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-kernel off on tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    kernel) echo "--- kernel $(date +%T)" >> $S
      timeout $(left 35) python3 $R/bench/gemv_rope.py --json $K >> $S 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^gemv_rope:|^pdl|Error|error|False" $S | tail -8 | cut -c1-300 | tee -a $L ;;
    off) side off 80 0 $OUT/rope12-off.json 64 ;;
    on) side on 80 1 $OUT/rope12-on.json 1,64 ;;
    tests) [ $((END - SECONDS)) -lt 30 ] && { echo "skipped: under 30 s left" | tee -a $L; continue; }
      # the greedy-token test is interpreter-only (it skips on CUDA); the kernel cases compile and launch by PDL here
      echo "--- tests $(date +%T)" >> $S
      timeout $(left 30) python3 -m pytest $R/tests/kernels/test_gemv_rope.py -q -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R >> $S 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "Error|error:|passed|failed" $S | tail -6 | cut -c1-300 | tee -a $L ;;
    summary) python3 - <<'PY' 2>&1 | tee $OUT/rope12-summary.tmp
import json, os
out = os.environ.get("OUT", "/tmp/out")
sides, notes = {}, []
for label in ("off", "on"):
    try:
        sides[label] = json.load(open(f"{out}/rope12-{label}.json"))
    except (OSError, ValueError) as e:
        notes.append(f"{label}: no result ({e.__class__.__name__})")
try:
    kern = json.load(open("/tmp/rope12-kernel.json"))
except (OSError, ValueError) as e:
    kern = {}
    notes.append(f"kernel: no result ({e.__class__.__name__})")
ms = {(l, r["batch"]): r["ms_per_step"] for l, s in sides.items() for r in s.get("latency", [])}


def first_diffs(a, b):
    return [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, b)]


diffs = first_diffs(sides["off"]["tokens"], sides["on"]["tokens"]) if all(
    "tokens" in sides.get(l, {}) for l in ("off", "on")) else []
row0 = diffs[0] if diffs else -1  # -1: nothing to compare
words = "equal" if row0 is None else "not compared" if row0 == -1 else f"DIFFER from position {row0}"
off1, on1 = ms.get(("off", 1)), ms.get(("on", 1))
if off1 and on1:
    print(f"DECISION bs1 ctx512: off {off1:.3f} ms, on {on1:.3f} ms ({(on1 - off1) * 1000:+.0f} us/step, on/off "
          f"{on1 / off1:.4f}); floor 4.05: {'MET' if on1 <= 4.05 else 'missed'}; lone-prompt greedy tokens {words}")
else:
    print(f"DECISION bs1: no figure (off {off1}, on {on1}); lone-prompt greedy tokens {words}")
us = kern.get("us_per_layer", {})
print(f"DECISION kernel: bit_equal {kern.get('bit_equal')} (q, K and V caches, bf16 and fp8 caches); us/layer pair "
      f"{us.get('pair')}, fused {us.get('fused')}, gemv alone {us.get('gemv_only')}; saved "
      f"{kern.get('saved_us_per_step')} us/step over 32 layers (pdl {kern.get('pdl')})")
why = [w for w, bad in (("bs1 not faster", not (off1 and on1 and on1 < off1)), ("tokens not equal", row0 is not None),
                         ("kernel not bit-equal or not run", not kern.get("bit_equal"))) if bad]
print("DECISION default FLOTILLA_QKV_ROPE = " + ("1: merge rope12 and flip the default in kernels/dispatch.py"
      if not why else f"0: keep main's path ({'; '.join(why)})"))
print("--- details")
for n in notes:
    print(n)
for label, s in sides.items():
    print(f"{label}: FLOTILLA_QKV_ROPE={'1' if label == 'on' else '0'}, start-up {s.get('startup_s', 0):.0f} s")
for (l, b), v in sorted(ms.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{l:4s} bs{b:<3d} {v:.3f} ms/step")
if ("off", 64) in ms and ("on", 64) in ms:
    print(f"bs64 on/off {ms[('on', 64)] / ms[('off', 64)]:.4f} (the same path on both sides: noise)")
if diffs:
    print(f"greedy tokens on vs off (row 0: the lone batch-1 prompt; then 64 prompts decoded together): "
          f"{sum(d is None for d in diffs)} of {len(diffs)} rows identical; differing (row, position): "
          f"{[(i, d) for i, d in enumerate(diffs) if d is not None]}")
for r in kern.get("check", []):
    if not (r["q_equal"] and r["k_equal"] and r["v_equal"]):
        print(f"kernel check NOT EQUAL: {r}")
for label, s in sides.items():
    for p in s.get("profiles", []):
        groups = ", ".join(f"{g} {v:.0f}" for g, v in p["groups_us_per_step"].items())
        print(f"profile {label} bs{p['batch']}: wall {p['wall_us_per_step']:.0f} us, busy {p['gpu_busy_us_per_step']:.0f}, "
              f"{p['launches_per_step']:.0f} launches; {groups}"
              + (" (bs1 under PDL: kernels overlap, times unusable; read the kernel names)" if p["batch"] == 1 else ""))
        for k in p["kernels"][:8]:
            print(f"   {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f} {k['name'][:90]}")
PY
      # the decision lines first in the log, then the stages' lines, then the rest of the summary
      { grep "^DECISION" $OUT/rope12-summary.tmp; cat $L; grep -v "^DECISION" $OUT/rope12-summary.tmp; } > $OUT/r12.tmp \
        && mv $OUT/r12.tmp $L; rm -f $OUT/rope12-summary.tmp ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

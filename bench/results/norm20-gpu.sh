#!/bin/bash
# Session 20, helper norm20 (issue 19: bf16 bs1 decode <= 1.15x the weight-read roofline): the RMSNorm (+ residual
# add) in the prologue of the one-row qkv-rope and gated GEMVs (FLOTILLA_NORM_GEMV, docs/decode-gemm.md), on against
# off in ONE engine, the switch flipped in-process (bench/norm_ab.py). One call (BUDGET_S, default 200 s),
# Llama-3.1-8B shape, bf16, random (dummy) weights, each stage in its own process under its own limit:
#   check  (40 s; no engine) the fused kernels at Llama-3.1-8B's shapes against the norm kernel + the same GEMV:
#          share of bit-equal outputs, largest difference, next residual bit-equal; plain-launch times of each pair
#   ab     (what is left - 40 s; start-up ~40-60 s) one engine: bs1 profiles off/on (launches a step, expected 236 ->
#          172; _rms_norm_kernel 65 -> 1), bs1 ctx 512 in the order on/off/off/on, greedy tokens on vs off, bs64
#          ctx 512 in the same order (a control: 64-row steps never take the prologue), then bs1 with one site each
#          (qkv/gated/gated/qkv). Its JSON is rewritten after each job: a stage cut short keeps what finished.
#   tests  (30 s) tests/kernels/test_norm_prologue.py on the GPU (the kernels against the norm kernel + GEMV, and the
#          PDL chain with both prologues captured in a CUDA graph against plain launches)
#   summary (always) DECISION lines -> the TOP of $OUT/norm20.log
# $OUT: norm20.log (read first), norm20-sides.log (each stage's whole output), norm20.json (both JSONs + summary).
# Run from the repository root (branch norm20, or main after the merge) carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/norm20-gpu.sh            (STAGES="check ab tests summary" by default)
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
W=/tmp/n20; rm -rf $W; mkdir -p $W; L=$OUT/norm20.log; S=$OUT/norm20-sides.log; : > $L; : > $S
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> $L 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L 2>&1
run() {  # label limit -- norm_ab.py arguments
  local label=$1 lim; lim=$(left $2); shift 3
  echo "--- $label $(date +%T) limit $lim s: $*" | tee -a $L >> $S
  timeout $lim python3 $R/bench/norm_ab.py --json $W/$label.json "$@" > $W/$label.log 2>&1
  echo "rc=$?" | tee -a $L
  cat $W/$label.log >> $S
  grep -E "^(CHECK|PROFILE|TOKENS|startup)|phase|Error|error" $W/$label.log | tail -24 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-check ab tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    check) run check 40 -- --jobs check ;;
    ab) run ab $((END - SECONDS - 40)) -- --jobs profile,ab1,tokens,ab64,sites ;;
    tests) echo "--- tests $(date +%T) limit $(left 30) s" | tee -a $L >> $S
      timeout $(left 30) python3 -m pytest $R/tests/kernels/test_norm_prologue.py -q -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R > $W/tests.log 2>&1
      echo "rc=$?" | tee -a $L
      cat $W/tests.log >> $S
      grep -E "Error|error:|passed|failed|FAILED" $W/tests.log | tail -8 | cut -c1-300 | tee -a $L ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/n20"
runs = {}
for label in ("check", "ab"):
    try:
        runs[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as e:
        runs[label] = {"error": f"no result ({e.__class__.__name__})"}
ab, s = runs["ab"], {}
print(f"DECISION / SUMMARY (norm20: FLOTILLA_NORM_GEMV, the RMSNorms in the one-row GEMVs' prologues; Llama-3.1-8B "
      f"shape, bf16, random weights; {ab.get('device', '?')}; session 19 main on an H100: bs1 5.710 ms, 236 launches)")
a1 = ab.get("ab1")
if a1 and {"0", "1"} <= a1["ms_per_step"].keys():
    on, off = a1["ms_per_step"]["1"], a1["ms_per_step"]["0"]
    roof = ab.get("roofline_ms", {}).get("bs1")
    s["bs1"] = {"on": on, "off": off, "ratio": on / off, "delta_us": 1e3 * (on - off)}
    ok = "tokens_equal" not in ab or ab["tokens_equal"] or (ab.get("tokens_first_difference") or 0) >= 8
    verdict = ("turn it on (FLOTILLA_NORM_GEMV default 1)" if on - off < -0.02 and ok else
               "keep it off (no gain over 20 us/step)" if on - off >= -0.02 else "CHECK the tokens before turning it on")
    print(f"DECISION bf16 bs1 ctx512 on/off/off/on: off {off:.3f} ms -> on {on:.3f} ms = {on / off:.4f}x "
          f"({1e3 * (on - off):+.0f} us/step; phases " + " ".join(f"{p['sites']}:{p['ms_per_step']:.3f}" for p in a1["phases"])
          + (f"; latency.py roofline {roof:.2f} ms: on {on / roof:.3f}x, off {off / roof:.3f}x" if roof else "") + f"): {verdict}")
else:
    print(f"DECISION bf16 bs1 A/B: incomplete ({ab.get('error', 'ab1 missing: see the stage lines')})")
prof = ab.get("profile", {})
if {"0", "1"} <= prof.keys():
    c0, c1 = prof["0"]["counts"], prof["1"]["counts"]
    s["launches"] = {"off": prof["0"]["launches_per_step"], "on": prof["1"]["launches_per_step"]}
    good = c1.get("_rms_norm_kernel", 99) <= 1.5 and prof["0"]["launches_per_step"] - prof["1"]["launches_per_step"] >= 60
    print(f"DECISION launches/step off {prof['0']['launches_per_step']:.0f} -> on {prof['1']['launches_per_step']:.0f} "
          f"(expected 236 -> 172); _rms_norm_kernel x{c0.get('_rms_norm_kernel', 0):.0f} -> x{c1.get('_rms_norm_kernel', 0):.0f} "
          f"(expected 65 -> 1); gemv_rope x{c1.get('_gemv_rope_kernel', 0):.0f}, gated x{c1.get('_gated_gemv_kernel', 0):.0f}: "
          f"{'the prologue took' if good else 'CHECK: the switch did not take'}")
if "tokens" in ab:
    print(f"DECISION greedy bs1 on vs off (32 tokens): " + ("equal" if ab.get("tokens_equal") else
          f"DIFFER from token {ab.get('tokens_first_difference')} (rstd's last fp32 bit: the prologue sums squares "
          "in K-tile order; see CHECK's equal share)"))
a64 = ab.get("ab64")
if a64 and {"0", "1"} <= a64["ms_per_step"].keys():
    on, off = a64["ms_per_step"]["1"], a64["ms_per_step"]["0"]
    s["bs64"] = {"on": on, "off": off}
    print(f"CONTROL bf16 bs64 ctx512 (same path both sides: noise): off {off:.3f} -> on {on:.3f} ms ({on / off:.4f}x)")
sites = ab.get("sites")
if sites and {"qkv", "gated"} <= sites["ms_per_step"].keys():
    q, g = sites["ms_per_step"]["qkv"], sites["ms_per_step"]["gated"]
    s["sites"] = {"qkv": q, "gated": g}
    print(f"SITES bs1 one fusion each (qkv/gated/gated/qkv): qkv only {q:.3f} ms, gated only {g:.3f} ms"
          + (f" (both {a1['ms_per_step']['1']:.3f}, neither {a1['ms_per_step']['0']:.3f})" if a1 and "1" in a1["ms_per_step"] else "")
          + ": FLOTILLA_NORM_GEMV=qkv or =gated alone where one site loses")
for site, r in (runs["check"].get("check") or {}).items():
    print(f"CHECK {site}: outputs bit-equal to norm kernel + GEMV {100 * r['equal_share']:.2f} %, max |diff| "
          f"{r['max_abs_diff']:.3g}, next residual bit-equal {r['residual_bit_equal']}; plain launches "
          f"{r.get('us_norm_then_gemv', 0):.1f} -> {r.get('us_fused', 0):.1f} us")
for label, r in runs.items():
    if "error" in r:
        print(f"STAGE {label}: {r['error']}")
try:
    tail = [l for l in open(f"{w}/tests.log").read().splitlines() if "passed" in l or "failed" in l or "error" in l]
    print(f"TESTS tests/kernels/test_norm_prologue.py on the GPU: {tail[-1] if tail else 'no summary line'}")
except OSError:
    print("TESTS not run")
if "startup_s" in ab:
    print(f"STAGE ab: startup {ab['startup_s']:.1f} s")
json.dump({"summary": s, "runs": runs}, open(f"{out}/norm20.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
echo "=== done $(date +%T)" >> $L
# the summary block first (a call cut before this line leaves the stage lines alone in norm20.log)
{ cat $W/summary.txt 2>/dev/null; echo; echo "--- stages"; cat $L; } > $W/final.log && cp $W/final.log $L

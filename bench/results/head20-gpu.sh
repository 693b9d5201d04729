#!/bin/bash
# Session 20, helper head20 (issues 22 and 19): the one-row LM head (Llama-3.1-8B: 128,256 x 4,096 bf16, 1.05 GB a
# decode step; cuBLAS's nvjet kernel 370.8 us = ~2.83 TB/s on an H100, 14 % of the int4 bs1 step) on the Triton GEMV
# (FLOTILLA_LM_HEAD_GEMV, kernels/dispatch.py lm_head_linear) against cuBLAS. One call (BUDGET_S, default 150 s),
# each stage under its own limit (capped by what is left):
#   micro (35 s) bench/lm_head_gemv.py: cuBLAS vs the GEMV's tile grid (20 s of it) at Llama-3.1-8B's head, then
#         cuBLAS / default / that winner at Qwen2.5-7B's, Llama-3.2-3B's and -1B's heads; each in a CUDA graph of calls
#         rotating over 2 weight copies; the winner's knobs are the 'on' value of the A/Bs below (else "1")
#   bf16  (52 s) bench/lm_head_ab.py, one bf16 engine (random Llama-3.1-8B shape): on/off/off/on bs1 ctx 512 steps,
#         a profile of the head's kernel on and off, 32 greedy tokens on vs off
#   int4  (58 s) the same in one W4A16 engine (bench/results/w4a16-model.sh; its LM head is bf16 too)
#   summary (always) SUMMARY lines -> the TOP of $OUT/head20.log; every figure -> $OUT/head20.json
# $OUT (3 files): head20.log (read first), head20-sides.log (every stage's whole output), head20.json.
# Run from the repository root (a `git archive` of branch head20) carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/head20-gpu.sh
# STAGES="micro summary" runs a subset; ON=bn=..,bk=.. forces the A/Bs' 'on' knobs.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
W=/tmp/head20; rm -rf $W; mkdir -p $W; L=$OUT/head20.log; S=$OUT/head20-sides.log; : > $L; : > $S
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> $L 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L 2>&1
on() {  # the A/Bs' 'on' value: $ON, else the micro grid's best GEMV, else the default tiles
  [ -n "${ON:-}" ] && { echo "$ON"; return; }
  python3 -c "import json; print(json.load(open('$W/micro.json'))['cases'][0]['best_gemv']['switch'])" 2>/dev/null \
    || echo 1
}
for s in ${STAGES:-micro bf16 int4 summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    micro) echo "--- micro $(date +%T) limit $(left 35) s" | tee -a $L >> $S
      timeout $(left 35) python3 $R/bench/lm_head_gemv.py --json $W/micro.json --budget-s 20 > $W/micro.log 2>&1
      echo "rc=$?" | tee -a $L
      cat $W/micro.log >> $S
      grep -E "^copy|^LMHEAD|^BEST|^SWITCH|Traceback|Error" $W/micro.log | head -40 | cut -c1-300 | tee -a $L ;;
    bf16|int4) model=""
      if [ $s = int4 ]; then source $R/bench/results/w4a16-model.sh >> $S 2>&1; model="--model /tmp/llama8b-w4a16"; fi
      lim=$([ $s = bf16 ] && echo 52 || echo 58); value=$(on)
      echo "--- $s $(date +%T) limit $(left $lim) s, on = $value" | tee -a $L >> $S
      timeout $(left $lim) python3 $R/bench/lm_head_ab.py $model --on "$value" --json $W/$s.json > $W/$s.log 2>&1
      echo "rc=$?" | tee -a $L
      cat $W/$s.log >> $S
      grep -E "^startup|phase|^AB|^PROFILE|^TOKENS|Traceback|Error" $W/$s.log | tail -14 | cut -c1-300 | tee -a $L ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/head20"
runs = {}
for label in ("micro", "bf16", "int4"):
    try:
        runs[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as e:
        runs[label] = {"error": f"no result ({e.__class__.__name__})"}
mi, bf, i4 = runs["micro"], runs["bf16"], runs["int4"]
print(f"SUMMARY head20 on {mi.get('device', bf.get('device', '?'))}: the one-row LM head, Triton GEMV "
      f"(FLOTILLA_LM_HEAD_GEMV) vs cuBLAS; before: cuBLAS 370.8 us/step in the bf16 profile (H100, s19 win14)")
copy = (mi.get("copy") or {}).get("gbps")
for c in mi.get("cases", []):
    cb, b = c.get("cublas", {}), c.get("best_gemv")
    d, mv = c.get("gemv default", {}), c.get("cublas mv", {})
    line = (f"SUMMARY micro {c['name']} ({c['n']}x{c['k']}): cuBLAS {cb.get('us', float('nan')):.1f} us "
            f"{cb.get('gbps', 0):.0f} GB/s (torch.mv {mv.get('us', float('nan')):.1f}); GEMV default "
            f"{d.get('us', float('nan')):.1f} us")
    if b:
        line += (f"; best {b['tag']} {b['us']:.1f} us = {b['vs_cublas']:.3f}x cuBLAS; with argmax "
                 f"{c['gemv+argmax']['us']:.1f} vs {c['cublas+argmax']['us']:.1f} us")
    print(line + (f" (copy {copy:.0f} GB/s)" if copy else ""))
print(f"SUMMARY micro switch: FLOTILLA_LM_HEAD_GEMV={mi.get('switch', '?')} (0: cuBLAS faster at Llama-3.1-8B's head)")
ms = {}
for label, r in (("bf16", bf), ("int4", i4)):
    a = (r.get("ab") or {}).get("ms_per_step")
    if not a:
        print(f"SUMMARY {label} A/B: no result {r.get('error', '')}")
        continue
    ms[label] = a
    ph = ", ".join(f"{p['switch']} {p['ms_per_step']:.3f}" for p in r["ab"]["phases"])
    graphed = sum(p["graphed"] for p in r["ab"]["phases"])
    steps = len(r["ab"]["phases"]) * r["ab"]["steps"]
    print(f"SUMMARY {label} bs1 ctx512 (on = {r.get('on')}): on {a['on']:.3f} ms, off {a['off']:.3f} ms, "
          f"{1e3 * (a['on'] - a['off']):+.0f} us a step ({ph}; graphed {graphed}/{steps})")
    for side, p in (r.get("profile") or {}).items():
        h = p["heads"]
        print(f"SUMMARY {label} profile {side}: {p['launches_per_step']:.0f} launches/step; cuBLAS "
              f"{h['cublas']['us_per_step']:.1f} us x{h['cublas']['launches_per_step']:.0f}, Triton _gemv_kernel "
              f"{h['triton_gemv']['us_per_step']:.1f} us x{h['triton_gemv']['launches_per_step']:.0f} (the layers' "
              f"o_proj/down + the head when on), argmax {h['argmax']['us_per_step']:.1f} us")
    if "tokens_equal" in r:
        print(f"SUMMARY {label} greedy tokens on vs off: "
              + ("equal" if r["tokens_equal"] else f"differ from token {r['tokens_first_difference']}"))
if "bf16" in ms and "int4" in ms:
    b, i = ms["bf16"], ms["int4"]
    print(f"SUMMARY int4/bf16 (separate engines, same call): both off {i['off'] / b['off']:.4f}x, both on "
          f"{i['on'] / b['on']:.4f}x (target <= 0.45x; s20 call 1: 2.631/5.713 = 0.461x)")
json.dump({"runs": runs}, open(f"{out}/head20.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
echo "=== done $(date +%T)" >> $L
# the summary block first (a call cut before this line leaves the stage lines alone in head20.log)
{ cat $W/summary.txt 2>/dev/null; echo; echo "--- stages"; cat $L; } > $W/final.log && cp $W/final.log $L

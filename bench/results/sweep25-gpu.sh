#!/bin/bash
# Session 25, helper sweep25 (issue 19: bf16 decode bs1 ctx 512 <= 4.05 ms, H200 4.421 today; issue 22: fp8 bs1 <=
# 0.62x bf16, 0.629x today): the one-row GEMV tiles of the bf16 and the fp8 engine chosen INSIDE the engine on the
# card the call runs on (bench/tile_sweep.py: coordinate descent over o / qkv / down / gate_up (/ lm_head for bf16),
# each candidate timed as whole graphed batch-1 decode steps, PDL chain and fused gated/rope forms as the engine runs
# them; candidates compiled by worker processes first). Llama-3.1-8B shape, random weights (--load-format dummy,
# /tmp/llama8b from bench/model_dirs.py). One call (BUDGET_S, default 560 s), each stage under its own limit (capped
# by what is left):
#   bf16 (255 s; start-up ~20-30 s, warm ~20 s a round, ~0.3 s a phase) tile_sweep.py --family bf16 --budget-s
#        (limit - 10): qkv (rope form), o, down (triton_gemv one-row table), gate_up (gated GEMV), lm_head (the head's
#        GEMV); its final A/B (orig new new orig, 64 steps each) and the greedy-token check
#   fp8  (255 s, skipped with under 60 s left) tile_sweep.py --family fp8 (the engine with --quantization fp8): the
#        one-row fp8 GEMV's qkv (rope form), o, gate_up (gated), down; A/B and tokens as above
#   summary (always) SUMMARY lines -> the TOP of $OUT/sweep25.log: each family's orig/new, the tables to adopt for the
#        card (per-card entries: triton_gemv.ONE_ROW_TILES, triton_gated_gemv.ONE_ROW_CONFIGS,
#        triton_fp8_row_gemv.MEASURED_CONFIGS; the LM head's FLOTILLA_LM_HEAD_GEMV), fp8 new / bf16 new (same call)
# Runs on an H100 as well (then the tables are the H100's: the card's name is in every SUMMARY line).
# $OUT (3 files): sweep25.log (read first), sweep25-sides.log (every stage's whole output), sweep25.json (both sweeps'
# JSON and the summary).
# Run from the repository root carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/sweep25-gpu.sh
# STAGES="fp8 summary" runs a subset; BF16_ARGS / FP8_ARGS add options (e.g. "--shapes o,down --steps 32").
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 560
W=/tmp/sweep25; rm -rf $W; mkdir -p $W; L=$OUT/sweep25.log; S=$OUT/sweep25-sides.log; : > $L; : > $S
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> $L 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L 2>&1
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null 2>> $S

sweep() {  # sweep FAMILY LIMIT EXTRA_ARGS
  echo "=== $1 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 60 ] && { echo "skipped: out of time" | tee -a $L; return; }
  local lim=$(left $2)
  echo "--- $1 limit $lim s" >> $S
  timeout $lim python3 $R/bench/tile_sweep.py --family $1 --model /tmp/llama8b --json $W/$1.json \
    --budget-s $((lim - 10)) $3 > $W/$1.log 2>&1
  echo "rc=$?" | tee -a $L
  cat $W/$1.log >> $S
  grep -E "^startup|^warm|^SWEEP|  ab |Traceback|Error" $W/$1.log | tail -30 | cut -c1-700 | tee -a $L
}

for s in ${STAGES:-bf16 fp8 summary}; do
  case $s in
    bf16) sweep bf16 255 "${BF16_ARGS:-}" ;;
    fp8) sweep fp8 255 "${FP8_ARGS:-}" ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
from stage_runs import load_runs  # bench/stage_runs.py
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/sweep25"
runs = load_runs(w, ("bf16", "fp8"))
card = runs["bf16"].get("device") or runs["fp8"].get("device") or "?"
print(f"SUMMARY sweep25 on {card}: one-row GEMV tiles by in-engine coordinate descent (bf16 engine, fp8 engine); "
      f"targets bf16 bs1 ctx512 <= 4.05 ms, fp8 <= 0.62x bf16 (H200 before: 4.421 ms, 2.780 = 0.629x)")
for fam, run in runs.items():
    ab = run.get("ab")
    if not ab:
        print(f"SUMMARY {fam}: no A/B ({run.get('error', 'cut before the end')}); phases so far "
              f"{len(run.get('phases', []))}; descent log in sweep25-sides.log")
        continue
    print(f"SUMMARY {fam} orig {ab['orig']:.3f} ms ({', '.join('%.3f' % v for v in ab['phases']['orig'])}), new "
          f"{ab['new']:.3f} ms ({', '.join('%.3f' % v for v in ab['phases']['new'])}): "
          f"{1e3 * (ab['new'] - ab['orig']):+.1f} us/step; greedy tokens equal: {run.get('tokens_equal')}; "
          f"descent stopped by the budget: {run.get('descent_stopped_early')}; phases {len(run.get('phases', []))}")
    for shape, t in (run.get("final_table") or {}).items():
        print(f"SUMMARY {fam} {shape}: {'same' if t == run['start_table'][shape] else 'CHANGED'} {t}")
    for line in run.get("adopt", []):
        print(f"SUMMARY {fam} adopt: {line}")
    if run.get("notes"):
        print(f"SUMMARY {fam} notes: {run['notes'][:6]}")
bf, f8 = runs["bf16"].get("ab"), runs["fp8"].get("ab")
if bf:
    print(f"SUMMARY bf16 new {bf['new']:.3f} ms -> {'MEETS' if bf['new'] <= 4.05 else 'misses'} 4.05 (issue 19)")
if bf and f8:
    r, r0 = f8["new"] / bf["new"], f8["orig"] / bf["orig"]
    print(f"SUMMARY fp8/bf16 (same call): orig {r0:.4f}x, new {r:.4f}x -> {'MEETS' if r <= 0.62 else 'misses'} 0.62 "
          f"(issue 22)")
json.dump({"runs": runs}, open(f"{out}/sweep25.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
echo "=== done $(date +%T)" >> $L
{ cat $W/summary.txt 2>/dev/null; echo; echo "--- stages"; cat $L; } > $W/final.log && cp $W/final.log $L

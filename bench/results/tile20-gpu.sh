#!/bin/bash
# Session 20, helper tile20 (issue 22: int4 W4A16 bs1 ctx 512 decode <= 0.45x the bf16 step; 2.597 vs 5.673 ms =
# 0.458x on an H100 before, ~44 us short): the wide int4 GEMV's tiles chosen INSIDE the engine (bench/int4_tile_sweep.py:
# coordinate descent over qkv / o / gate_up / down, each candidate timed as whole graphed decode steps with the PDL
# chain and the fused gated/rope forms as the engine runs them), then a bf16 baseline in its own process of the call.
# Llama-3.1-8B shape, random weights (compressed-tensors W4A16 g128 symmetric, bench/results/w4a16-model.sh). One call
# (BUDGET_S, default 240 s), each stage under its own limit (capped by what is left):
#   sweep (175 s; start-up ~30 s, candidates compiled by worker processes first, ~0.4 s a phase) int4_tile_sweep.py
#         --budget-s (the stage's limit less 10): the descent stops in time for its final A/B (orig new new orig, 64
#         steps each) and the greedy-token check
#   bf16  (60 s, skipped with under 40 s left) bench/decode_ab.py, bf16 defaults: bs1 ctx 512 step (the ratio's
#         denominator; session 20 call 2: 5.673 ms)
#   summary (always) SWEEP/SUMMARY lines -> the TOP of $OUT/tile20.log
# $OUT (3 files): tile20.log (read first), tile20-sides.log (every stage's whole output), tile20.json (the sweep's JSON,
# bf16's, the summary).
# Run from the repository root (a `git archive` of branch tile20) carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/tile20-gpu.sh
# STAGES="sweep summary" runs a subset; SWEEP_ARGS adds options (e.g. "--shapes o,down --steps 32").
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
source $R/bench/results/bf16-stages.sh tile20 /tmp/tile20  # W, L, S, stage_head, stage_tail, bf16_stage, summary_first
for s in ${STAGES:-sweep bf16 summary}; do
  stage_head $s
  case $s in
    sweep) [ $((END - SECONDS)) -lt 60 ] && { echo "skipped: out of time" | tee -a $L; continue; }
      source $R/bench/results/w4a16-model.sh >> $S 2>&1  # /tmp/llama8b-w4a16 (and /tmp/llama8b)
      lim=$(left 175); echo "--- sweep $(date +%T) limit $lim s" | tee -a $L >> $S
      timeout $lim python3 $R/bench/int4_tile_sweep.py --model /tmp/llama8b-w4a16 --json $W/sweep.json \
        --budget-s $((lim - 10)) ${SWEEP_ARGS:-} > $W/sweep.log 2>&1
      stage_tail $? $W/sweep.log "^startup|^warm|^SWEEP|  ab |Traceback|Error" 30 600 ;;
    bf16) [ $((END - SECONDS)) -lt 40 ] && { echo "skipped: out of time" | tee -a $L; continue; }
      bf16_stage 60 ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
from stage_runs import bf16_bs1, bf16_line, load_runs  # bench/stage_runs.py
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/tile20"
runs = load_runs(w, ("sweep", "bf16"))
sw, bf = runs["sweep"], runs["bf16"]
_, bf_ms = bf16_bs1(bf)
print(f"SUMMARY tile20 on {sw.get('device', bf.get('device', '?'))}: int4 W4A16 bs1 ctx512 wide-GEMV tiles by in-engine "
      f"coordinate descent; target <= 0.45x bf16 (before: 2.597 / 5.673 ms = 0.458x, H100)")
print(bf16_line(bf))
ab = sw.get("ab")
if ab:
    for name in ("orig", "new"):
        r = ab[name] / bf_ms if bf_ms else None
        print(f"SUMMARY int4 {name}: {ab[name]:.3f} ms ({', '.join('%.3f' % v for v in ab['phases'][name])})"
              + (f", {r:.4f}x bf16 -> {'MEETS' if r <= 0.45 else 'misses'} 0.45" if r else ""))
    print(f"SUMMARY new - orig: {1e3 * (ab['new'] - ab['orig']):+.1f} us/step; greedy tokens equal: "
          f"{sw.get('tokens_equal')}; descent stopped by the budget: {sw.get('descent_stopped_early')}; "
          f"phases {len(sw.get('phases', []))}, warm {sw.get('warm_s', float('nan')):.0f} s")
    for shape, t in (sw.get("final_table") or {}).items():
        o = sw["start_table"][shape]
        print(f"SUMMARY {shape}: {'same' if t == o else 'CHANGED'} {t}")
    print(f"SUMMARY FLOTILLA_INT4_GEMV_WIDE_CONFIG=\"{sw.get('config')}\"")
else:
    print(f"SUMMARY sweep: no A/B ({sw.get('error', 'cut before the end')}); phases so far "
          f"{len(sw.get('phases', []))}; descent log in tile20-sides.log")
if sw.get("rope_unfused"):
    print(f"SUMMARY qkv candidates the rope form rejected (unfused pair timed): {sw['rope_unfused']}")
json.dump({"runs": runs}, open(f"{out}/tile20.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
summary_first

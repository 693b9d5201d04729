#!/bin/bash
# Session 20, helper int4f20 (issue 22: int4 W4A16 bs1 ctx 512 decode <= 0.45x the bf16 step; 2.702 vs 5.710 ms =
# 0.473x on an H100 before): the wide int4 GEMV's one-row fused forms (kernels/triton_int4_gemv_fused.py) A/B'd in ONE
# int4 engine, and a bf16 baseline in its own process of the same call, so that the ratio is within one call.
# Llama-3.1-8B shape, random weights (compressed-tensors W4A16 g128 symmetric, bench/results/w4a16-model.sh; bf16:
# bench/model_dirs.py). One call (BUDGET_S, default 240 s), each stage under its own limit (capped by what is left):
#   int4  (150 s; start-up ~30 s in session 16 call 3, recaptures ~0.1 s) bench/int4_fused_ab.py: variants none /
#         gated (FLOTILLA_INT4_GATED) / rope (FLOTILLA_INT4_QKV_ROPE) / both, flipped in-process (decode graphs
#         captured again), phases in the order none gated rope both both rope gated none, 64 timed steps each at context 512 (a fresh request per
#         phase); launches a step per variant (profiler: counts only); 32 greedy tokens per variant (equal expected)
#   bf16  (70 s) bench/decode_ab.py, bf16 defaults: bs1 ctx 512 step (the ratio's denominator)
#   summary (always) SUMMARY lines -> the TOP of $OUT/int4f20.log; every figure -> $OUT/int4f20.json
# $OUT (3 files): int4f20.log (read first: the summary, then each stage's lines), int4f20-sides.log (every stage's
# whole output), int4f20.json (both stages' JSON + the summary).
# Run from the repository root (a `git archive` of branch int4f20) carrying .whl (the pydantic stack, as
# bench/results/http-speed-gpu.sh's header lists; no HTTP stack needed):
#   OUT=... bash bench/results/int4f20-gpu.sh
# STAGES="int4 summary" runs a subset.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
source $R/bench/results/bf16-stages.sh int4f20 /tmp/i4f20  # W, L, S, stage_head, stage_tail, bf16_stage, summary_first
for s in ${STAGES:-int4 bf16 summary}; do
  stage_head $s
  [ $s != summary ] && [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    int4) source $R/bench/results/w4a16-model.sh >> $S 2>&1  # /tmp/llama8b-w4a16 (and /tmp/llama8b)
      echo "--- int4 $(date +%T) limit $(left 150) s" | tee -a $L >> $S
      timeout $(left 150) python3 $R/bench/int4_fused_ab.py --model /tmp/llama8b-w4a16 --json $W/int4.json \
        > $W/int4.log 2>&1
      stage_tail $? $W/int4.log "^startup|variant|phase|^AB|launches|tokens|Traceback|Error" 30 300 ;;
    bf16) bf16_stage 70 ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
from stage_runs import bf16_bs1, bf16_line, load_runs  # bench/stage_runs.py
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/i4f20"
runs = load_runs(w, ("int4", "bf16"))
i4, bf = runs["int4"], runs["bf16"]
bf1, bf_ms = bf16_bs1(bf)
ms = (i4.get("ab") or {}).get("ms_per_step") or {}
s = {"bf16_bs1_ms": bf_ms, "int4_bs1_ms": ms, "target_ratio": 0.45, "before": "2.702 ms = 0.473x of 5.710 (H100)"}
print(f"SUMMARY int4f20 on {i4.get('device', bf.get('device', '?'))}: int4 W4A16 bs1 ctx512 step by fused forms "
      f"(one engine, in-process switches) against bf16 bs1 ctx512 (own process, same call); target <= 0.45x")
print(bf16_line(bf, graphed=True))
s["ratio"] = {}
for name in ("none", "gated", "rope", "both"):
    if name not in ms:
        print(f"SUMMARY int4 {name:5s}: no result {i4.get('failed', {}).get(name, i4.get('error', ''))[:200]}")
        continue
    phases = [p for p in i4["ab"]["phases"] if p["name"] == name]
    ratio = ms[name] / bf_ms if bf_ms else None
    s["ratio"][name] = ratio
    d = 1e3 * (ms[name] - ms["none"]) if "none" in ms else float("nan")
    print(f"SUMMARY int4 {name:5s}: {ms[name]:.3f} ms/step ({', '.join('%.3f' % p['ms_per_step'] for p in phases)}; "
          f"graphed {sum(p['graphed'] for p in phases)}/{sum(p['steps'] for p in phases)}), {d:+.0f} us vs none"
          + (f", {ratio:.4f}x bf16 -> {'MEETS' if ratio <= 0.45 else 'misses'} 0.45" if ratio else ""))
for name, r in (i4.get("launches") or {}).items():
    k = r["kernels"]
    print(f"SUMMARY launches {name:5s}: {r['launches_per_step']:.0f}/step; plain int4 GEMV x{k['_int4_gemv_wide_kernel']:.0f}"
          f", gated x{k['_int4_gated_kernel']:.0f}, rope x{k['_int4_rope_kernel']:.0f}, SiLU x{k['_silu_and_mul_kernel']:.0f}"
          f", rotary/KV x{k['_rotary_kv_write_kernel']:.0f}")
s["launches"] = i4.get("launches")
both = (i4.get("launches") or {}).get("both")
if both:
    k = both["kernels"]
    ok = (k["_int4_gated_kernel"] >= 32 and k["_int4_rope_kernel"] >= 32 and not k["_silu_and_mul_kernel"]
          and not k["_rotary_kv_write_kernel"])
    print(f"SUMMARY fused forms taken under 'both' (expected gated 32, rope 32, SiLU 0, rotary 0): "
          f"{'yes' if ok else 'CHECK'}")
tokens = i4.get("tokens") or {}
if tokens:
    base = tokens.get("none")
    same = {n: t == base for n, t in tokens.items()}
    s["tokens_equal"] = same
    print(f"SUMMARY greedy tokens equal to none's (expected all True): {same}")
if "startup_s" in i4:
    print(f"SUMMARY int4 start-up {i4['startup_s']:.1f} s; bf16 start-up {bf.get('startup_s', float('nan')):.1f} s")
json.dump({"summary": s, "runs": runs}, open(f"{out}/int4f20.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
summary_first  # the summary block first (a call cut before this line leaves the stage lines alone in int4f20.log)

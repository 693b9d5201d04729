#!/bin/bash
# Issue 19 (and issue 22's fp8 batch 1): the decode step at batch 1 x context 512, Llama-3.1-8B shape, graphed, with
# the one-row kernel chain launched by programmatic dependent launch (kernels/pdl.py, FLOTILLA_PDL=1) against plain
# launches, on the H200, one call (BUDGET_S, default 220 s). Floors: bf16 bs1 <= 4.05 ms (4.64 before), fp8 bs1
# <= 0.62x the bf16 step (0.668x before). Stages, each under its own limit (capped by what is left; a stage is
# skipped with < 15 s left; the summary always runs):
#   off    (55 s) bench/decode_ab.py, FLOTILLA_PDL=0: greedy tokens (24) of one prompt alone (batch 1: the GEMVs)
#          and of 8 prompts decoded together, ms/step at batch 1 and 64 (ctx 512, graphed), per-kernel profile at
#          batch 1 (a cold Triton cache compiles here)
#   on     (50 s) the same with FLOTILLA_PDL=1 (tokens must equal off's: PDL changes no rounding)
#   fp8on  (40 s) bench/quant_gpu.py --quantization fp8 --jobs bs1 (W8A16 GEMVs), FLOTILLA_PDL=1
#   fp8off (40 s) the same, FLOTILLA_PDL=0
#   tests  (35 s) with FLOTILLA_PDL=1: tests/kernels/test_pdl.py (the peeled GEMV launched by PDL bit-equal to the
#          plain one; the norm -> GEMV -> SiLU -> GEMV -> norm -> rotary chain by PDL in a CUDA graph, with and
#          without the L2 prefetch, bit-equal to plain launches) and the norm / SiLU / rotary+KV tests
#   l2     (35 s) decode_ab.py at batch 1 with FLOTILLA_PDL=1 FLOTILLA_PDL_L2_MB=${L2_MB:-24}: each PDL GEMV also
#          prefetches the first part of its weight into L2 before its wait, and a PDL kernel ahead of each one-row
#          cuBLAS projection (bf16 gate_up, LM head) its weight's first MB (the one prompt's tokens must equal off's)
#   fp8l2  (35 s) fp8on with FLOTILLA_PDL_L2_MB=${L2_MB:-24}
#   l2b    (35 s) l2 with FLOTILLA_PDL_L2_MB=${L2B_MB:-12} (half the budget: is 24 MB past what L2 keeps?)
#   summary       ms/step per side against 4.05 ms, on/off, fp8/bf16 against 0.62, tokens, bs1 profiles
# Output (3 files): $OUT/pdl10.log (read first: every stage's lines and the summary), $OUT/pdl10-sides.log (the
# sides' and tests' full output), $OUT/pdl10.json (every side's JSON and the summary).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   BUDGET_S=220 bash bench/results/pdl10-gpu.sh
# STAGES="off on summary" runs the bf16 A/B alone (~100 s).
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 220
L=$OUT/pdl10.log; S=$OUT/pdl10-sides.log; W=/tmp/pdl10w; mkdir -p $W
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
side() {  # label limit batch-sizes profile-sizes token-batches env...
  local label=$1 lim; lim=$(left $2); local sizes=$3 prof=$4 toks=$5; shift 5
  echo "--- $label $(date +%T) limit $lim s: $*" >> $S
  env "$@" timeout $lim python3 $R/bench/decode_ab.py --label $label --batch-sizes $sizes --profile-batch-sizes "$prof" \
    --token-batch $toks --context 512 --json $W/$label.json >> $S 2>&1
  echo "rc=$?" | tee -a $L
  sed -n "/^--- $label /,\$p" $S | grep -E "^$label:|Error|error" | tail -4 | cut -c1-300 | tee -a $L
}
fp8() {  # label limit env...
  local label=$1 lim; lim=$(left $2); shift 2
  echo "--- $label $(date +%T) limit $lim s: $*" >> $S
  env "$@" timeout $lim python3 $R/bench/quant_gpu.py --model /tmp/llama8b --name $label --quantization fp8 \
    --jobs bs1 --max-num-seqs 16 --json $W/$label.json 2>&1 | grep -v "^QUANT_JSON" >> $S
  echo "rc=${PIPESTATUS[0]}" | tee -a $L
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); b=r.get('bs1', {}); print(r['name'], 'startup %.0f s' % r['startup_s'], 'bs1 %s ms/step' % b.get('ms_per_step'), 'graphed %s/%s' % (b.get('graphed_steps'), b.get('steps')), 'fp8 gemv rows', r.get('fp8_paths', {}).get('fp8_gemv'))" \
    $W/$label.json 2>&1 | tail -1 | tee -a $L
}
for s in ${STAGES:-off on fp8on fp8off tests l2 fp8l2 l2b summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    off) side off 55 1,64 1 1,8 FLOTILLA_PDL=0 ;;
    on) side on 50 1,64 1 1,8 FLOTILLA_PDL=1 ;;
    l2) side l2 35 1 "" 1 FLOTILLA_PDL=1 FLOTILLA_PDL_L2_MB=${L2_MB:-24} ;;
    l2b) side l2b 35 1 "" 1 FLOTILLA_PDL=1 FLOTILLA_PDL_L2_MB=${L2B_MB:-12} ;;
    fp8on) fp8 fp8on 40 FLOTILLA_PDL=1 ;;
    fp8off) fp8 fp8off 40 FLOTILLA_PDL=0 ;;
    fp8l2) fp8 fp8l2 35 FLOTILLA_PDL=1 FLOTILLA_PDL_L2_MB=${L2_MB:-24} ;;
    tests) echo "--- tests $(date +%T)" >> $S
      FLOTILLA_PDL=1 timeout $(left 35) python3 -m pytest $R/tests/kernels/test_pdl.py $R/tests/kernels/test_rmsnorm.py \
        $R/tests/kernels/test_activation.py $R/tests/kernels/test_rotary_kv_write.py \
        -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R >> $S 2>&1
      echo "rc=$?" | tee -a $L
      sed -n '/^--- tests/,$p' $S | grep -E "Error|error:|passed|failed|FAILED|skipped" | tail -12 | cut -c1-300 | tee -a $L ;;
    summary) python3 - $W <<'PY' 2>&1 | tee -a $L
import json, os, sys
w, out = sys.argv[1], os.environ.get("OUT", "/tmp/out")
sides = {}
for label in ("off", "on", "l2", "l2b", "fp8on", "fp8off", "fp8l2"):
    try:
        sides[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as e:
        print(f"{label}: no result ({e.__class__.__name__})")
ms = {(l, r["batch"]): r["ms_per_step"] for l, s in sides.items() for r in s.get("latency", [])}
ms |= {(l, 1): s["bs1"]["ms_per_step"] for l, s in sides.items() if "bs1" in s}
summary = {"ms_per_step": {f"{l} bs{b}": v for (l, b), v in ms.items()}, "floor_bs1_ms": 4.05, "fp8_target": 0.62}
for (l, b), v in sorted(ms.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    extra = f" (floor 4.05: {'MET' if v <= 4.05 else 'missed'})" if b == 1 and not l.startswith("fp8") else ""
    print(f"{l:6s} bs{b:<3d} {v:.3f} ms/step{extra}")
def ratio(key, a, b, note=""):
    if a in ms and b in ms:
        summary[key] = ms[a] / ms[b]
        print(f"{key}: {ms[a] / ms[b]:.4f}{note}")
ratio("on/off bs1", ("on", 1), ("off", 1))
ratio("on/off bs64", ("on", 64), ("off", 64))
ratio("l2/off bs1", ("l2", 1), ("off", 1))
ratio("l2/on bs1", ("l2", 1), ("on", 1))
ratio("l2b/on bs1", ("l2b", 1), ("on", 1))
ratio("fp8l2/fp8on bs1", ("fp8l2", 1), ("fp8on", 1))
ratio("fp8l2/l2 bs1", ("fp8l2", 1), ("l2", 1), " (target <= 0.62)")
ratio("fp8on/fp8off bs1", ("fp8on", 1), ("fp8off", 1))
ratio("fp8on/on bs1", ("fp8on", 1), ("on", 1), " (target <= 0.62)")
ratio("fp8off/off bs1", ("fp8off", 1), ("off", 1), " (before: 0.668)")
ratio("fp8on/off bs1", ("fp8on", 1), ("off", 1), " (fp8 with PDL against the plain bf16 step)")
for label in ("on", "l2", "l2b"):
    if "tokens" in sides.get("off", {}) and "tokens" in sides.get(label, {}):
        a, b = sides["off"]["tokens"], sides[label]["tokens"]
        n = min(len(a), len(b))
        same = sum(x == y for x, y in zip(a, b))
        summary[f"tokens_identical_rows {label}"] = f"{same}/{n}"
        print(f"greedy tokens {label} vs off (row 0: one prompt alone at batch 1; rows 1-8: 8 prompts together): "
              f"{same} of {n} rows identical" + (" (IDENTICAL)" if same == n > 0 else " (DIFFER)"))
for label, s in sides.items():
    for p in s.get("profiles", []):
        groups = ", ".join(f"{g} {us:.0f}" for g, us in p["groups_us_per_step"].items())
        print(f"profile {label} bs{p['batch']}: wall {p['wall_us_per_step']:.0f} us, busy {p['gpu_busy_us_per_step']:.0f}, "
              f"{p['launches_per_step']:.0f} launches; {groups}")
        for k in p["kernels"][:9]:
            print(f"   {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f} {k['name'][:90]}")
json.dump({"summary": summary, "sides": sides}, open(f"{out}/pdl10.json", "w"), indent=1)
PY
      ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

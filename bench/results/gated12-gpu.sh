source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
# Issue 19 on the H200 (branch gated12), one call, BUDGET_S (default 200 s) of device time: bf16 decode at batch 1 x
# context 512 (Llama-3.1-8B shape; floor 4.05 ms, main 4.50) with the one-row gated GEMV (kernels/triton_gated_gemv.py,
# FLOTILLA_GATED_GEMV=1: gate and up rows streamed by one kernel launched by PDL, silu(gate) * up written, no SiLU
# kernel) against main's cuBLAS gate_up + SiLU kernel. Stages, each under its own limit (capped by what is left):
#   gemv    (55 s) bench/gated_gemv.py: at M = 1, cuBLAS + SiLU ("pair") vs the one-row GEMV + SiLU vs the gated GEMV
#           (PDL and plain), and the MLP chain RMSNorm -> gate/up(+SiLU) -> down GEMV with each; every output checked
#           against the pair first (CASE lines); then a 14-config tile sweep (SWEEP lines, compiled in parallel while
#           the cases run) and BEST: the engine config for the on side ($W/best.txt; "default" unless a passing
#           config beat the default by > 1 %; GATED12_CONFIG overrides, e.g. GATED12_CONFIG=default).
#   off     (60 s) bench/decode_ab.py, FLOTILLA_GATED_GEMV=0 (main's path): greedy tokens (24) of one prompt alone
#           (batch 1) and of 64 prompts together, ms/step at batch 1 and 64 (ctx 512, graphed), kernel profiles at
#           batch 64 then batch 1 (the bs1 profile's times are unusable under PDL, busy > wall: only its kernel
#           names and launch counts are read).
#   on      (60 s) the same with FLOTILLA_GATED_GEMV=1 (and FLOTILLA_GATED_GEMV_CONFIG from the gemv stage).
#   tests   (25 s, only if time is left) tests/kernels/test_gated_gemv.py + test_pdl.py on the GPU (compiled, PDL).
#   summary the DECISION lines (always runs), put at the top of the log.
# Output (3 files): $OUT/gated12-gpu.log (read first: DECISION, then every stage), $OUT/gated12-gpu.json (summary
# + both engine JSONs), $OUT/gated12-gemv.json (cases and sweep).
# Run from the repository root on the H200 machine, carrying .whl (pydantic stack), as the other scripts:
#   OUT=... BUDGET_S=200 bash bench/results/gated12-gpu.sh
L=$OUT/gated12-gpu.log; W=/tmp/gated12w; mkdir -p $W
rm -f $W/*.json $W/*.log $W/best.txt $W/decision.txt $W/on-config.txt $W/log.tmp
side() {  # label limit env...
  local label=$1 lim; lim=$(left $2); shift 2
  echo "--- $label $(date +%T) limit $lim s: $*" | tee -a $L
  env "$@" timeout $lim python3 $R/bench/decode_ab.py --label $label --batch-sizes 1,64 --profile-batch-sizes 64,1 \
    --token-batch 1,64 --context 512 --json $W/$label.json > $W/$label.log 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "^$label:|Error|error" $W/$label.log | grep -v Warning | tail -6 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-gemv off on tests summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    gemv) timeout $(left 55) python3 $R/bench/gated_gemv.py --json $OUT/gated12-gemv.json --best-out $W/best.txt \
        > $W/gemv.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "^(CASE|SWEEP|BEST|compile)|Error|error" $W/gemv.log | cut -c1-300 | tee -a $L ;;
    off) side off 60 FLOTILLA_GATED_GEMV=0 ;;
    on) cfg=$(cat $W/best.txt 2>/dev/null); cfg=${GATED12_CONFIG:-${cfg:-default}}; [ "$cfg" = default ] && cfg=""
      echo "${cfg:-<default bn=8,bk=512,w=4,s=2>}" > $W/on-config.txt
      side on 60 FLOTILLA_GATED_GEMV=1 FLOTILLA_GATED_GEMV_CONFIG=$cfg ;;
    tests) if [ $((END - SECONDS)) -lt 30 ]; then echo "skipped: kept for the summary" | tee -a $L; continue; fi
      timeout $(left 25) python3 -m pytest $R/tests/kernels/test_gated_gemv.py $R/tests/kernels/test_pdl.py -q \
        -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R > $W/tests.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "Error|error:|passed|failed|FAILED" $W/tests.log | tail -8 | cut -c1-300 | tee -a $L ;;
    summary) python3 - $W $OUT <<'PY' 2>&1 | tee $W/decision.txt
import json, sys
w, out = sys.argv[1], sys.argv[2]
sides = {}
for label in ("off", "on"):
    try:
        sides[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as exc:
        sides[label] = {"error": repr(exc)[:200]}
ms = {(l, r["batch"]): r["ms_per_step"] for l, s in sides.items() for r in s.get("latency", [])}
summary = {"ms_per_step": {f"{l} bs{b}": v for (l, b), v in ms.items()}, "floor_bs1_ms": 4.05}
for b in (1, 64):
    off, on = ms.get(("off", b)), ms.get(("on", b))
    if off and on:
        summary[f"on/off bs{b}"] = on / off
        floor = f"; floor 4.05: {'MET' if on <= 4.05 else 'missed'} (off {'MET' if off <= 4.05 else 'missed'})" if b == 1 else ""
        print(f"STEP bs{b}: off {off:.3f} ms -> on {on:.3f} ms = {on / off:.4f}x{floor}")
    else:
        print(f"STEP bs{b}: n/a (off {off}, on {on})")
try:
    summary["on_config"] = open(f"{w}/on-config.txt").read().strip()
except OSError:
    summary["on_config"] = None
print(f"CONFIG on: FLOTILLA_GATED_GEMV=1 FLOTILLA_GATED_GEMV_CONFIG={summary['on_config']}")
ta, tb = sides["off"].get("tokens"), sides["on"].get("tokens")
if ta and tb:
    n = min(len(ta), len(tb))
    same = sum(x == y for x, y in zip(ta, tb))
    first = next((i for i, (x, y) in enumerate(zip(ta[0], tb[0])) if x != y), min(len(ta[0]), len(tb[0])))
    row0 = "equal" if ta[0] == tb[0] else f"DIFFER from token {first} of {len(ta[0])}"
    summary["tokens_identical_rows"] = f"{same}/{n}"
    summary["tokens_bs1_row"] = row0
    print(f"GREEDY on vs off: batch-1 prompt (the gated GEMV's path) {row0}; all rows {same}/{n} identical "
          "(rows 1-64: 64 prompts together, the skinny GEMM's path, must be identical)")
else:
    print("GREEDY: n/a")
try:
    g = json.load(open(f"{out}/gated12-gemv.json"))
    c = g.get("cases", {})
    def us(name):
        return c.get(name, {}).get("us")
    for a, b in (("pair", "gated"), ("pair", "gated_plain"), ("mlp_pair", "mlp_gated")):
        if us(a) and us(b):
            r = c[b]
            print(f"KERNEL {a} {us(a):.2f} us -> {b} {us(b):.2f} us ({us(b) - us(a):+.2f} us, x32 layers "
                  f"{32 * (us(b) - us(a)) / 1000:+.3f} ms/step); vs pair: rel {r['rel_err']:.1e}, "
                  f"equal {r['equal_share']:.3f}" + ("" if r.get("ok") else " FAILED"))
        else:
            print(f"KERNEL {a} vs {b}: n/a ({c.get(a, {}).get('error', '')} {c.get(b, {}).get('error', '')})"[:300])
    if us("gemv_pair"):
        print(f"KERNEL gemv_pair (one-row GEMV over 28,672 rows + SiLU) {us('gemv_pair'):.2f} us")
    summary["kernels"] = {k: v.get("us") for k, v in c.items()}
    summary["sweep_best"] = g.get("best")
    ok = sorted((r for r in g.get("sweep", []) if r.get("ok") and r.get("us")), key=lambda r: r["us"])[:3]
    print("SWEEP top: " + "; ".join(f"{r['config']} {r['us']:.2f} us {r['gbps']:.0f} GB/s" for r in ok)
          + f" -> engine config {g.get('best')}")
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(f"KERNEL n/a: {exc!r}"[:200])
for label, s in sides.items():
    for p in s.get("profiles", []):
        names = {k["name"]: k for k in p.get("kernels", [])}
        gated = names.get("_gated_gemv_kernel", {}).get("launches_per_step", 0)
        silu = names.get("_silu_and_mul_kernel", {}).get("launches_per_step", 0)
        note = " (times unusable under PDL)" if p["batch"] == 1 else ""
        print(f"PROFILE {label} bs{p['batch']}: wall {p['wall_us_per_step']:.0f} us, busy {p['gpu_busy_us_per_step']:.0f}, "
              f"{p['launches_per_step']:.0f} launches; _gated_gemv_kernel x{gated:.0f}, _silu_and_mul_kernel x{silu:.0f}{note}; "
              + ", ".join(f"{g} {v:.0f}" for g, v in p["groups_us_per_step"].items()))
summary["sides"] = sides
json.dump(summary, open(f"{out}/gated12-gpu.json", "w"), indent=1)
PY
      # the decision lines first in the log, then the stages as they ran
      { echo "=== DECISION (summary stage; gated12; merge if STEP bs1 on < off with bs64 unchanged and the kernel checks pass)"
        cat $W/decision.txt; cat $L; } > $W/log.tmp && cp $W/log.tmp $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

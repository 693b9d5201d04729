#!/bin/bash
# Session 14, helper win14: main's headline decode figures on the H200 after merging rope12 (FLOTILLA_QKV_ROPE) and
# gated12 (FLOTILLA_GATED_GEMV, one-row config bn=4,bk=512,w=4,s=3), both ON by default. One call (BUDGET_S, default
# 240 s), Llama-3.1-8B shape, random (dummy) weights; every stage is an existing entry point (bench/decode_ab.py:
# bench/latency.py's step_latency + roofline_ms, bench/decode_profile.py's profile_batch; bench/quant_gpu.py for the
# int4 W4A16 checkpoint, as int4g-gpu.sh), each in its own process under its own limit (capped by what is left):
#   on     (75 s: the first engine compiles the Triton kernels on a cold cache) bf16, the defaults (both fusions
#          on; the switches left unset, so the defaults themselves are measured): greedy tokens of 1 and of 64
#          prompts, ms/step at bs1 and bs64 ctx 512, a bs1 profile of 8 steps (kernel names and launch counts only:
#          proof the fused kernels ran; its times are unusable under PDL)
#   off    (45 s) bf16, FLOTILLA_QKV_ROPE=0 FLOTILLA_GATED_GEMV=0 (main before the merge): tokens, bs1 ctx 512 (A/B)
#   fp8    (45 s) defaults, --quantization fp8 (W8A16 GEMV at bs1; the fused bf16 kernels do not apply): bs1 ctx 512
#   ctx4k  (75 s: ~65 s in session 12, start-up + 64 x 4,096 prefilled) bf16, the defaults: bs64 ctx 4,096
#          (attention-bound; against the bf16 roofline)
#   int4   (80 s, only if >= 60 s are left: ~60 s in session 14, start-up 55 s) bench/quant_gpu.py on the compressed-tensors W4A16 model dir
#          (bench/results/w4a16-model.sh), bs1 ctx 512
#   summary       (always) DECISION / HEADLINE block -> the TOP of $OUT/win14.log; all figures -> $OUT/win14.json
# $OUT (3 files): win14.log (read first: summary block, then each stage's lines), win14-sides.log (every stage's
# whole output), win14.json (every stage's JSON merged + the summary). Per-stage JSONs stay in /tmp/w14.
# Run from the repository root (a `git archive` of branch win14) carrying .whl (the pydantic stack):
#   OUT=... BUDGET_S=240 bash bench/results/win14-gpu.sh
# STAGES="on off summary" runs a subset.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
W=/tmp/w14; rm -rf $W; mkdir -p $W; L=$OUT/win14.log; S=$OUT/win14-sides.log; : > $L; : > $S  # L: the summary goes on top at the end
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> $L 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L 2>&1
ab() {  # label limit [env VAR=VALUE ...] -- [decode_ab.py arguments...]
  local label=$1 lim; lim=$(left $2); shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "--- $label $(date +%T) limit $lim s: ${envs[*]} $*" | tee -a $L >> $S
  env "${envs[@]}" timeout $lim python3 $R/bench/decode_ab.py --label $label --json $W/$label.json "$@" \
    > $W/$label.log 2>&1
  echo "rc=$?" | tee -a $L
  cat $W/$label.log >> $S
  grep -E "^$label:|Error|error" $W/$label.log | tail -6 | cut -c1-300 | tee -a $L
}
for s in ${STAGES:-on off fp8 ctx4k int4 summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $s != summary ] && [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    on) ab on 75 W14_SIDE=defaults -- --batch-sizes 1,64 --token-batch 1,64 \
          --profile-batch-sizes 1 --profile-steps 8 ;;
    off) ab off 45 FLOTILLA_QKV_ROPE=0 FLOTILLA_GATED_GEMV=0 -- --batch-sizes 1 --token-batch 1,64 \
           --profile-batch-sizes "" ;;
    fp8) ab fp8 45 W14_SIDE=defaults -- --quantization fp8 --batch-sizes 1 --token-batch 1 \
           --profile-batch-sizes "" ;;
    ctx4k) ab ctx4k 75 W14_SIDE=defaults -- --context 4096 --batch-sizes 64 --token-batch 1 \
             --profile-batch-sizes "" ;;
    int4) [ $((END - SECONDS)) -lt 60 ] && { echo "skipped: under 60 s left (int4 start-up ~55 s)" | tee -a $L; continue; }
      source $R/bench/results/w4a16-model.sh >> $S 2>&1  # /tmp/llama8b-w4a16 (by $R: gpu-env.sh changed to /tmp)
      echo "--- int4 $(date +%T) limit $(left 80) s" | tee -a $L >> $S
      timeout $(left 80) python3 $R/bench/quant_gpu.py --model /tmp/llama8b-w4a16 --name int4 --weights int4 \
        --jobs bs1 --max-num-seqs 16 --json $W/int4.json > $W/int4.log 2>&1
      echo "rc=$?" | tee -a $L
      cat $W/int4.log >> $S
      grep -E "^Traceback|Error|error" $W/int4.log | tail -3 | cut -c1-300 | tee -a $L ;;
    summary) python3 - > $W/summary.txt 2>&1 <<'PY'
import json, os
out, w = os.environ.get("OUT", "/tmp/out"), "/tmp/w14"
runs = {}
for label in ("on", "off", "fp8", "ctx4k", "int4"):
    try:
        runs[label] = json.load(open(f"{w}/{label}.json"))
    except (OSError, ValueError) as e:
        runs[label] = {"error": f"no result ({e.__class__.__name__})"}
def row(label, batch):
    r = runs[label]
    if label == "int4":  # bench/quant_gpu.py's row: its roofline at int4 weight bytes
        b = r.get("bs1") or {}
        return b if batch == 1 and "ms_per_step" in b else None
    return next((x for x in r.get("latency", []) if x["batch"] == batch), None)
on1, off1, on64, fp81, ctx64, int41 = (row("on", 1), row("off", 1), row("on", 64), row("fp8", 1), row("ctx4k", 64),
                                       row("int4", 1))
bf16 = on1["ms_per_step"] if on1 else None
s = {"ms_per_step": {}, "previous_main": {"bf16 bs1 ctx512": 4.490, "bf16 bs64 ctx512": "5.715-5.729",
     "bf16 bs64 ctx4096": 12.571, "fp8 bs1 ctx512": 3.171, "int4 bs1 ctx512": 3.438}}
print("DECISION / SUMMARY (win14 = main + rope12 + gated12, both on by default; Llama-3.1-8B shape, random weights)")
if on1 and off1:
    d = on1["ms_per_step"] - off1["ms_per_step"]
    s["on_over_off_bs1"] = on1["ms_per_step"] / off1["ms_per_step"]
    verdict = ("keep both on (default)" if d < -0.02 else
               "CHECK: the fusions saved under 20 us/step here (measured -43 and -50 us apart in session 14)")
    print(f"DECISION bf16 bs1 ctx512 A/B: off (QKV_ROPE=0 GATED_GEMV=0) {off1['ms_per_step']:.3f} ms -> on (defaults) "
          f"{on1['ms_per_step']:.3f} ms = {s['on_over_off_bs1']:.4f}x ({1e3 * d:+.0f} us/step; expected ~-90: "
          f"4.490 -> 4.447 rope12, -> 4.440 gated12 alone): {verdict}")
else:
    print(f"DECISION bf16 bs1 A/B: incomplete (on {runs['on'].get('error', 'ok')}, off {runs['off'].get('error', 'ok')})")
if "tokens" in runs["on"] and "tokens" in runs["off"]:
    a, b = runs["off"]["tokens"], runs["on"]["tokens"]
    first = next((i for i, (p, q) in enumerate(zip(a[0], b[0])) if p != q), None)
    rest = sum(x == y for x, y in zip(a[1:], b[1:]))
    s["greedy"] = {"bs1_first_difference": first, "rows_1_64_identical": rest, "rows": len(a) - 1}
    print(f"DECISION greedy on vs off: batch-1 prompt {'equal' if first is None else f'DIFFERS from token {first}'} "
          f"(expected to differ: the gated GEMV sums in the GEMV's order, not cuBLAS's); 64 prompts together (bs64 "
          f"path, unchanged): {rest}/{len(a) - 1} rows identical ({'OK' if rest == len(a) - 1 else 'UNEXPECTED'})")
prof = next(iter(runs["on"].get("profiles", [])), None)
if prof:
    counts = {n: sum(k["launches_per_step"] for k in prof["kernels"] if n in k["name"])
              for n in ("_gemv_rope_kernel", "_gated_gemv_kernel", "_rotary_kv_write_kernel", "_silu_and_mul_kernel")}
    s["on_bs1_kernel_launches"] = counts
    ok = counts["_gemv_rope_kernel"] >= 32 and counts["_gated_gemv_kernel"] >= 32 and not (
        counts["_rotary_kv_write_kernel"] or counts["_silu_and_mul_kernel"])
    print("DECISION on bs1 profile (launches/step; expected 32 32 0 0): "
          + ", ".join(f"{n} x{c:.0f}" for n, c in counts.items()) + f": {'switches took' if ok else 'CHECK'}; "
          f"{prof['launches_per_step']:.0f} launches/step (main 300)")
print("HEADLINE (ms/step; x-roofline = over bench/latency.py's bf16-bytes roofline at the H200's peaks (int4: "
      "quant_gpu.py's int4 bytes), card's = the same at this card's measured peaks (bench/card_peaks.py); "
      "x-bf16 = over this call's bf16 bs1 on)")
for name, r, prev in (("bf16 bs1 ctx512 (on)", on1, "4.490"), ("bf16 bs1 ctx512 (off)", off1, "4.490"),
                      ("bf16 bs64 ctx512", on64, "5.715-5.729"), ("bf16 bs64 ctx4096", ctx64, "12.571 (s12)"),
                      ("fp8 bs1 ctx512", fp81, "3.171 = 0.706x"), ("int4 bs1 ctx512", int41, "3.438 = 0.765x")):
    if not r:
        print(f"HEADLINE {name:22s} no result")
        continue
    ms, roof = r["ms_per_step"], r.get("roofline_ms_bf16") or r.get("roofline_ms")
    card = r.get("roofline_ms_bf16_card") or r.get("roofline_ms_card")  # the measured card's (bench/card_peaks.py)
    s["ms_per_step"][name] = ms
    kind = "int4-bytes roofline" if "int4" in name else "roofline"
    xr = f"{kind} {roof:.2f} = {ms / roof:.3f}x" if roof else "roofline n/a"
    xr += f", card's {card:.2f} = {ms / card:.3f}x" if card else ""
    xb = f", {ms / bf16:.3f}x bf16" if bf16 and ("fp8" in name or "int4" in name) else ""
    graphed = f", graphed {r['graphed_steps']}/{r['steps']}" if "steps" in r else ""
    print(f"HEADLINE {name:22s} {ms:7.3f} ms ({xr}{xb}{graphed}); session 14 main before: {prev}")
for label, r in runs.items():
    if "error" in r:
        print(f"STAGE {label}: {r['error']}")
    elif "startup_s" in r:
        print(f"STAGE {label}: startup {r['startup_s']:.1f} s" + (f", int4 paths {r.get('int4_paths')}" if label == "int4" else ""))
if prof:
    print(f"PROFILE on bs1: wall {prof['wall_us_per_step']:.0f} us, busy {prof['gpu_busy_us_per_step']:.0f} (times unusable "
          "under PDL); " + ", ".join(f"{g} {us:.0f}" for g, us in prof["groups_us_per_step"].items()))
    for k in prof["kernels"][:12]:
        print(f"   {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f} {k['name'][:90]}")
json.dump({"summary": s, "runs": runs}, open(f"{out}/win14.json", "w"), indent=1)
PY
      cat $W/summary.txt ;;
  esac
done
echo "=== done $(date +%T)" >> $L
# the summary block first (a call cut before this line leaves the stage lines alone in win14.log)
{ cat $W/summary.txt 2>/dev/null; echo; echo "--- stages"; cat $L; } > $W/final.log && cp $W/final.log $L

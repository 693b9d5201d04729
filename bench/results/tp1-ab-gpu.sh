#!/bin/bash
# Issue 20's tp=1 no-regression as an A/B in one device call: bench/latency.py, decode at batch 1 and 64, context
# 512, Llama-3.1-8B shape with dummy bf16 weights (the flags of tp-gpu.sh's tp1 stage), on the base tree (A, the
# commit before the multi-process executor and parallelism landed) and on this tree (B), interleaved A B A B, each
# run a fresh process; prints every run, the mean of each side and B/A per batch size (target: within 2 %).
# Prepare A here first (the device gets the working tree without .git):
#   bash bench/results/make-ab-base.sh            -> .ab-base/ (base c5415da by default; the script says why)
# then, from the repository root on the H200 machine, carrying .whl (pydantic stack, as gpu-2026-12-03.sh) and
# .ab-base (run's carry: [".whl", ".ab-base"]):
#   BUDGET_S=200 bash bench/results/tp1-ab-gpu.sh   -> $OUT/tp1-ab.log, $OUT/tp1-ab-{A,B}{1,2}.json, tp1-ab-summary.json
# One run took ~30 s on 2026-12-03 (engine start 17 s with graph capture, then 2 x 32 timed steps), so four fit.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/tp1-ab.log
[ -f "$R/.ab-base/COMMIT" ] || { echo "no .ab-base/COMMIT: run bench/results/make-ab-base.sh and carry .ab-base" | tee -a $L; exit 1; }
echo "A = base $(cat "$R/.ab-base/COMMIT"), B = this tree" | tee -a $L
# The base tree laid out as a package, as gpu-env.sh lays out this one in /tmp/p.
mkdir -p /tmp/pa/flotilla && cp "$R"/.ab-base/flotilla/*.py /tmp/pa/flotilla/ \
  && ln -sfn "$R/.ab-base/engine" /tmp/pa/flotilla/engine && ln -sfn "$R/.ab-base/kernels" /tmp/pa/flotilla/kernels
ARGS="--shape llama-3.1-8b --batch-sizes 1,64 --contexts 512 --steps 32"
run() {  # side (A|B), round, tree root, package layout
  local side=$1 round=$2 root=$3 pkg=$4
  echo "=== $side$round $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 25 ] && { echo "skipped: out of time" | tee -a $L; return; }
  # Each tree's own bench/latency.py (its folder is sys.path[0]), its own package first on the path.
  (cd "$root" && PYTHONPATH=/tmp/site:$pkg timeout $(left 50) python3 bench/latency.py $ARGS \
    --json $OUT/tp1-ab-$side$round.json 2>&1 | grep -v "^{" | grep -v INFO | tail -4 | tee -a $L)
}
for round in 1 2; do
  run A $round "$R/.ab-base" /tmp/pa
  run B $round "$R" /tmp/p
done
python3 - <<'PY' 2>&1 | tee -a $L
import json, os, statistics
out = os.environ["OUT"]
runs = {}
for name in ("A1", "B1", "A2", "B2"):
    try:
        runs[name] = {r["batch"]: r["ms_per_step"] for r in json.load(open(f"{out}/tp1-ab-{name}.json"))["flotilla"]
                      if "ms_per_step" in r}
    except (OSError, ValueError, KeyError) as e:
        runs[name] = {}
        print(f"{name}: no result ({e})")
summary = {"runs": runs, "batches": {}}
for batch in (1, 64):
    a = [runs[n][batch] for n in ("A1", "A2") if batch in runs[n]]
    b = [runs[n][batch] for n in ("B1", "B2") if batch in runs[n]]
    if not a or not b:
        print(f"batch {batch}: incomplete (A {a}, B {b})")
        continue
    ratio = statistics.fmean(b) / statistics.fmean(a)
    summary["batches"][batch] = {"A_ms": a, "B_ms": b, "B_over_A": ratio, "within_2pct": ratio <= 1.02}
    print(f"batch {batch}, ctx 512: A {' '.join(f'{x:.3f}' for x in a)} ms, B {' '.join(f'{x:.3f}' for x in b)} ms; "
          f"B/A {ratio:.4f} ({'within' if ratio <= 1.02 else 'OVER'} 2 %)")
json.dump(summary, open(f"{out}/tp1-ab-summary.json", "w"), indent=1)
PY
echo "=== done $(date +%T)" | tee -a $L

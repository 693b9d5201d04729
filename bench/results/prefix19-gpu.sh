#!/bin/bash
# Issue 19, "TTFT of a request whose 2,000-token prefix is cached >= 10x lower than uncached" (session 19, branch
# prefix19): the host's part of a cached-prefix request, A/B in one device call. A = the base tree (.ab-base), B = this
# tree (prefix19: add_request range-checks only the ids after the cached blocks and hashes the prompt for the scheduler;
# allocate skips the revived count when the pool has room; graph staging with fewer numpy writes).
#   host   bench/prefix_host.py on the device machine's CPU (tiny random Llama, stub forward: the host alone), this
#          tree's script over each tree's package, A B A B (~10 s each): ms from add_request to the first kernel and
#          the critical path (that + collect -> token)
#   ttft   bench/prefix.py with prefix7-gpu.sh's "on" flags (Llama-3.1-8B shape, dummy bf16, 2,000 cached + 20 new,
#          levers on) without the kernel profile, plus --host-timeline 10 (ms from add_request to schedule end,
#          staging end, replay call, sync end, token), A B A B (~35 s each)
# Prepare A here first (the device gets the working tree without .git), at the commit this branch forked from:
#   bash bench/results/make-ab-base.sh c64ebf9     -> .ab-base/
# then on the device machine from the repository root, carrying what prefix7-gpu.sh needs plus .ab-base
# (run's carry: [".whl", ".ab-base"]):
#   BUDGET_S=200 bash bench/results/prefix19-gpu.sh   -> $OUT/prefix19-gpu.log (summary at the end),
#   $OUT/prefix19-{host,ttft}-{A,B}{1,2}.json
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/prefix19-gpu.log
[ -f "$R/.ab-base/COMMIT" ] || { echo "no .ab-base/COMMIT: run bench/results/make-ab-base.sh and carry .ab-base" | tee -a $L; exit 1; }
echo "A = base $(cat "$R/.ab-base/COMMIT"), B = this tree" | tee -a $L
mkdir -p /tmp/pa/flotilla && cp "$R"/.ab-base/flotilla/*.py /tmp/pa/flotilla/ \
  && ln -sfn "$R/.ab-base/engine" /tmp/pa/flotilla/engine && ln -sfn "$R/.ab-base/kernels" /tmp/pa/flotilla/kernels
ARGS="--shape llama-3.1-8b --load-format dummy --skip-batch --single-engine --prefix-len 2000 --suffix-len 20
  --output-len 16 --repeats 5 --max-num-batched-tokens 8192 --host-timeline 10"
host() {  # side, round, package layout
  echo "=== host $1$2 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  OMP_NUM_THREADS=1 PYTHONPATH=/tmp/site:$3:$R/bench timeout $(left 30) python3 $R/bench/prefix_host.py --repeats 40 \
    --label "$1$2" --json $OUT/prefix19-host-$1$2.json 2>&1 | grep -E "^$1$2|Error" | tee -a $L
}
ttft() {  # side, round, tree root, package layout
  echo "=== ttft $1$2 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 30 ] && { echo "skipped: out of time" | tee -a $L; return; }
  # Each tree's own bench/prefix.py (its folder is sys.path[0]), its own package first on the path.
  (cd "$3" && FLOTILLA_PREFILL_TILE_MEMO=1 FLOTILLA_ONE_SEQ_GRAPHS=1 PYTHONPATH=/tmp/site:$4 timeout $(left 60) \
    python3 bench/prefix.py $ARGS --json $OUT/prefix19-ttft-$1$2.json > $OUT/prefix19-ttft-$1$2.out 2>&1
   echo "rc=$?" | tee -a $L; grep -E "Error|error|runs eagerly" $OUT/prefix19-ttft-$1$2.out | tail -3 | tee -a $L)
}
for round in 1 2; do
  host A $round /tmp/pa
  host B $round /tmp/p
done
for round in 1 2; do
  ttft A $round "$R/.ab-base" /tmp/pa
  ttft B $round "$R" /tmp/p
done
python3 - <<'PY' 2>&1 | tee -a $L
import json, os, statistics
out = os.environ["OUT"]
def load(kind, name):
    try:
        return json.load(open(f"{out}/prefix19-{kind}-{name}.json"))
    except (OSError, ValueError):
        return None
for side in "AB":
    hosts = [h["median_ms"] for h in (load("host", f"{side}{r}") for r in (1, 2)) if h]
    if hosts:
        keys = ("add", "schedule", "forward", "critical")
        print(f"host CPU {side}: " + ", ".join(f"{k} {statistics.fmean(h.get(k, float('nan')) for h in hosts):.3f}"
                                              for k in keys) + f" ms ({len(hosts)} runs)")
    runs = [r for r in (load("ttft", f"{side}{k}") for k in (1, 2)) if r]
    for r in runs:
        s = r["single_cold_vs_warm"]
        print(f"ttft {side}: uncached {1e3 * s['uncached_ttft_s']:.2f} ms, cached {1e3 * s['cached_ttft_s']:.2f} ms -> "
              f"{s['speedup']:.2f}x; cached pairs {[round(1e3 * w, 2) for _, w in s['pairs_s']]}")
        t = r.get("cached_host_timeline", {}).get("median_ms")
        if t:
            print("   host timeline (ms from add_request): " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    if runs:
        cached = [1e3 * r["single_cold_vs_warm"]["cached_ttft_s"] for r in runs]
        ratio = [r["single_cold_vs_warm"]["speedup"] for r in runs]
        print(f"POOLED {side}: cached {statistics.fmean(cached):.3f} ms, ratio {statistics.fmean(ratio):.2f}x")
PY
echo "=== done $(date +%T)" | tee -a $L

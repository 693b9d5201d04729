#!/bin/bash
# Issue 19, "TTFT of a request whose 2,000-token prefix is cached >= 10x lower than uncached" (session 22, branch
# ttft22): the host's part of a lone cached-prefix request's TTFT on the GPU path, before and after session 22's host
# cuts (the prompt's block keys as one run with struct.pack, the staging's
# row search bounded, BlockManager.free with locals), in ONE device call on the Llama-3.1-8B shape, random bf16 weights.
# Stages (STAGES="on base host" by default, ~150 s; BUDGET_S=180):
#   on    prefix7's `on` stage (bench/prefix.py, 2,000 cached + 20 new tokens, one engine, every lever on, the step trace,
#         the cached request's kernels) plus --host-timeline 10: ms from add_request to the end of each host phase on
#         the GPU path (the id check with the prompt's block keys, add_request, the look-up, the allocation, schedule,
#         flatten, the staging, the replay's call, the draw's launches, collect's wait, update, post-processing) (~50 s)
#   base  the same without the kernel profile, on this tree with session 22's engine changes reversed
#         (bench/results/cpu-ttft22-2026-12-05-s22/engine.patch applied with -R to a copy of engine/; without `patch` or
#         `git` on the machine the base stages are skipped): the A/B (~45 s)
#   host  bench/prefix_host.py --phases --clock cpu on this machine's CPU (quiet, unlike the 2-core box the CPU figures
#         came from): the tiny model, the graph path's staging run eagerly, a stub forward; base vs this tree,
#         3 rounds interleaved (~40 s)
#   BUDGET_S=180 bash bench/results/ttft22-gpu.sh          (STAGES="on" alone is prefix7's measurement, ~50 s)
# Outputs in $OUT: ttft22-gpu.log (summary at the end), ttft22-<on|base>.json, ttft22-<on|base>-steps.jsonl,
# ttft22-host.json.
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 180
L=$OUT/ttft22-gpu.log
ARGS="--shape llama-3.1-8b --load-format dummy --skip-batch --single-engine --prefix-len 2000 --suffix-len 20
  --output-len 16 --repeats 5 --max-num-batched-tokens 8192 --host-timeline 10"
# The tree before session 22's host cuts: engine/ copied, the branch's engine diff reversed; flotilla/ laid out as
# gpu-env.sh lays out this tree's (in /tmp/pb).
base_tree() {
  [ -d /tmp/ttft22-base/engine ] && return 0
  mkdir -p /tmp/ttft22-base && cp -r $R/engine $R/flotilla $R/bench /tmp/ttft22-base/ && ln -sfn $R/kernels /tmp/ttft22-base/kernels
  local P=$R/bench/results/cpu-ttft22-2026-12-05-s22
  # Without `patch` or `git` on the machine there is no base: the A/B stages say so and stop
  (cd /tmp/ttft22-base && { patch -s -R -p1 < $P/engine.patch 2>/dev/null || git apply -R $P/engine.patch 2>/dev/null; }) \
    || { echo "base tree: engine.patch did not apply (no patch or git here?): no base stages" | tee -a $L
         rm -rf /tmp/ttft22-base; return 1; }
  mkdir -p /tmp/pb/flotilla && cp /tmp/ttft22-base/flotilla/*.py /tmp/pb/flotilla/ \
    && ln -sfn /tmp/ttft22-base/engine /tmp/pb/flotilla/engine && ln -sfn $R/kernels /tmp/pb/flotilla/kernels
}
run() {  # run NAME PYTHONPATH TIME_LIMIT_S [EXTRA ARGS]
  echo "=== $1 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  PYTHONPATH=$2 FLOTILLA_STEP_TRACE=$OUT/ttft22-$1-steps.jsonl timeout $(left $3) python3 $R/bench/prefix.py $ARGS ${4:-} \
    --json $OUT/ttft22-$1.json > $OUT/ttft22-$1.out 2>&1
  echo "rc=$?" | tee -a $L
  grep -E "Error|error|captured|runs eagerly" $OUT/ttft22-$1.out | tail -4 | tee -a $L
  rm -f $OUT/ttft22-$1.out
}
for s in ${STAGES:-on base host}; do
  case $s in
    on) run on $PYTHONPATH 60 --profile-kernels ;;
    base) base_tree && run base /tmp/site:/tmp/pb:$R/bench 55 ;;
    host) echo "=== host $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
      base_tree && OMP_NUM_THREADS=1 timeout $(left 60) python3 $R/bench/prefix_host.py --trees /tmp/ttft22-base $R \
        --rounds 3 --repeats 30 --phases --clock cpu --json $OUT/ttft22-host.json 2>&1 | tail -6 | tee -a $L ;;
  esac
done
python3 - <<'PY' | tee -a $L
import json, os, statistics
out = os.environ.get("OUT", "/tmp/out")
for name in ("base", "on"):
    try:
        r = json.load(open(f"{out}/ttft22-{name}.json"))
    except (OSError, ValueError):
        continue
    s = r["single_cold_vs_warm"]
    print(f"{name}: uncached {1e3 * s['uncached_ttft_s']:.2f} ms, cached {1e3 * s['cached_ttft_s']:.2f} ms -> "
          f"{s['speedup']:.2f}x; cached pairs {[round(1e3 * w, 2) for _, w in s['pairs_s']]}")
    t = r.get("cached_host_timeline", {}).get("median_ms", {})
    if t:
        print("   host timeline (ms from add_request): " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
        t.setdefault("sync_end", t.get("collect_start", float("nan")))  # the wait's end (collect's start: no GPU)
        d = lambda a, b: t.get(b, float("nan")) - t.get(a, float("nan"))  # noqa: E731
        print(f"   phases (ms): add {t.get('add_end', float('nan')):.3f} (id check + block keys "
              f"{t.get('check_ids_end', float('nan')):.3f}), schedule {d('add_end', 'schedule_end'):.3f} (look-up end "
              f"{t.get('lookup_end', float('nan')):.3f}, allocation end {t.get('allocate_end', float('nan')):.3f}), "
              f"flatten {d('schedule_end', 'flatten_end'):.3f}, stage {d('flatten_end', 'stage_end'):.3f}, to the replay "
              f"{d('stage_end', 'replay_start'):.3f}, replay call {d('replay_start', 'replay_end'):.3f}, draw launches "
              f"{d('draw_start', 'draw_end'):.3f}; after the wait: ids {d('sync_end', 'collect_end'):.3f}, update "
              f"{d('collect_end', 'update_end'):.3f}, post {d('update_end', 'post_end'):.3f}, out {d('post_end', 'token'):.3f}")
        print(f"   host on the critical path: {t.get('replay_start', float('nan')) + d('sync_end', 'token'):.3f} ms "
              f"(to the replay {t.get('replay_start', float('nan')):.3f} + after the wait {d('sync_end', 'token'):.3f})")
    try:
        steps = [json.loads(x) for x in open(f"{out}/ttft22-{name}-steps.jsonl")]
    except OSError:
        continue
    ext = [x for x in steps if x["prefill"] and x["prefill_tokens"] <= 64]  # the cached requests' extends
    if ext:
        med = lambda k: statistics.median(x[k] for x in ext)  # noqa: E731
        print(f"   trace: {len(ext)} extend steps, median host {med('host_ms')} ms, sync {med('sync_ms')} ms, step "
              f"{med('step_ms')} ms, engine TTFT median {statistics.median(x['ttft_ms'] for x in ext if 'ttft_ms' in x)} ms")
PY

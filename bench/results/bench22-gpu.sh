#!/bin/bash
# Session 22, helper bench22: the benchmarks whose loops moved into shared ones still run on a GPU, each once at a
# small size (the figures are not the point: tiny shapes, few calls). Changed, behaviour meant unchanged:
#   - the per-kernel profiler loop is bench/decode_profile.py's `kernel_times` / `grouped` in host_phases.py (the
#     replay-alone and mixed-step profiles), lora.py (--profile-steps), prefix.py (--profile-kernels) and
#     spec_step_overhead.py (--kernel-profile);
#   - the GEMV timing is bench/timing.py's `time_variant` in int4_gemv.py and gated_gemv.py, bench/kernels.py's
#     `graph_ms` in skinny_gemm.py and gemv_rope.py (graph_ms gained `iters` and `stat` for gemv_rope's best of
#     --repeats timings of --iters replays).
# Stages (STAGES, in this order; each under its own limit, 25-40 s (rc=124: cut), inside BUDGET_S, default 240 s):
#   timing     tests/test_bench_timing.py (its CUDA test times a product through time_variant): expect "2 passed";
#   gemv_rope  --layers 4 --iters 5 --repeats 2: bit_equal True, three us/layer figures;
#   int4       --rows 1 --paths int4_gemv,bf16_cublas: 4 INT4 lines; rows keep "us", "gbps", "rel_err" (no "ms");
#   skinny     --rows 32 --shapes qkv,o, no grid: 2 BEST lines (torch and the default config, with rel_err);
#   gated      --calls 8 --reps 3 --workers 8 (the 14-config sweep compiled meanwhile): 6 CASE lines, SWEEP lines,
#              one BEST line; rows keep ok/equal_share/max_abs/us/gbps (gbps None on the mlp_* cases);
#   host       host_phases.py at tiny-llama, batch 8 x 64, 8 steps: replay_ms, profile_groups_us, mixed_profile;
#   spec       spec_step_overhead.py --device cuda, 1 request of 16 tokens, --kernel-profile: kernels_us_per_step;
#   prefix     prefix.py at tiny-llama (dummy), --profile-kernels: cached_request_profile's groups and span;
#   lora       lora.py at tiny-llama, rank 8, batch 1 and 4, --profile-steps 2: kernels_us_per_step with "busy".
# After each stage that exits 0 a `KEYS` line lists what its JSON holds where the change could show (printed, not
# enforced). $OUT: bench22.log (read first: GPU, each stage's rc, its key lines and KEYS), one JSON per stage.
# Run from the repository root carrying .whl (the pydantic stack, as bench/results/lora-gpu.sh's header lists):
#   OUT=... bash bench/results/bench22-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
L=$OUT/bench22.log
B=$R/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
keys() {  # $1: JSON file; $2: a Python expression over `d` (the loaded JSON) printed as the KEYS line
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('KEYS', $2)" "$1" 2>&1 | cut -c1-600 | tee -a $L
}
run() {  # $1: stage; $2: limit (s); $3: lines to keep (grep -E); the rest: the command
  local stage=$1 lim=$2 pat=$3; shift 3
  echo "=== $stage $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; return 1; }
  timeout $(left $lim) "$@" > /tmp/bench22-$stage.log 2>&1
  local rc=$?
  echo "rc=$rc" | tee -a $L
  grep -E "$pat|Traceback|Error" /tmp/bench22-$stage.log | tail -12 | cut -c1-300 | tee -a $L
  return $rc
}
for s in ${STAGES:-timing gemv_rope int4 skinny gated host spec prefix lora}; do
  case $s in
    timing) run timing 25 "passed|failed|skipped" python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml \
              --rootdir=$R -q -rs $R/tests/test_bench_timing.py ;;
    gemv_rope) run gemv_rope 25 "us/layer|^gemv_rope:" python3 $B/gemv_rope.py --layers 4 --iters 5 --repeats 2 \
                 --json $OUT/gemv_rope.json \
               && keys $OUT/gemv_rope.json "d['bit_equal'], d['us_per_layer']" ;;
    int4) run int4 35 "^copy|^INT4" python3 $B/int4_gemv.py --rows 1 --paths int4_gemv,bf16_cublas \
            --json $OUT/int4.json \
          && keys $OUT/int4.json "[(c['name'], sorted(c['int4_gemv']), c.get('best_int4_gemv')) for c in d['cases']]" ;;
    skinny) run skinny 25 "^BEST|^CONFIGS" python3 $B/skinny_gemm.py --rows 32 --shapes qkv,o --grid-rows '' \
              --workers 1 --calls 8 --reps 3 --json $OUT/skinny.json \
            && keys $OUT/skinny.json "[sorted(r) for r in d['rows']]" ;;
    gated) run gated 40 "^CASE|^SWEEP|^BEST" python3 $B/gated_gemv.py --calls 8 --reps 3 --workers 8 \
             --json $OUT/gated.json \
           && keys $OUT/gated.json "{k: sorted(v) for k, v in d['cases'].items()}, \
d['cases']['mlp_gated'].get('gbps'), len(d['sweep']), sorted(d['sweep'][0]), d['best']" ;;
    host) run host 30 "^host" python3 $B/host_phases.py --shape tiny-llama --batch 8 --context 64 --steps 8 \
            --json $OUT/host.json \
          && keys $OUT/host.json "[(r.get('replay_ms'), r.get('profile_busy_us'), r.get('profile_groups_us'), \
r.get('profile_error'), r.get('mixed_profile')) for r in d['results']]" ;;
    spec) run spec 25 "^none|^oracle" python3 $B/spec_step_overhead.py --device cuda --modes none,oracle-right \
            --requests 1 --max-tokens 16 --kernel-profile --json $OUT/spec.json \
          && keys $OUT/spec.json "{m: (r['gpu_busy_us_per_step'], len(r['kernels_us_per_step'])) \
for m, r in d['results'].items()}" ;;
    prefix) run prefix 25 "ttft|speedup" python3 $B/prefix.py --shape tiny-llama --load-format dummy --num-requests 4 \
              --prefix-len 64 --suffix-len 8 --output-len 4 --repeats 1 --single-engine --profile-kernels \
              --json $OUT/prefix.json \
            && keys $OUT/prefix.json "{k: v for k, v in d['cached_request_profile'].items() if k != 'kernels'}" ;;
    lora) run lora 35 "^\{" python3 $B/lora.py --shape tiny-llama --rank 8 --adapters 2 --batch-sizes 1,4 \
            --context 32 --steps 4 --profile-steps 2 --workdir /tmp/bench22-lora --json $OUT/lora.json \
          && keys $OUT/lora.json "[(r['batch'], r.get('kernels_us_per_step', {}).get('busy'), \
len(r.get('kernels_us_per_step', {}))) for r in d['rows']]" ;;
  esac
done
echo "=== done $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L

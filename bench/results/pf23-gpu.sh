#!/bin/bash
# Session 23, helper pf23: the prefill kernel's prompt half (issue 19's offline step: 31 prompts of 512 tokens beside
# 448 decode rows, ~150 TFLOP/s in `_prefill_kernel`, bench/results/gpu-2026-12-05-s22/README.md). New key-loop forms,
# each a switch and a launch parameter (docs/decode-gemm.md, "The prefill kernel's key loop"):
#   FLOTILLA_PREFILL_LEAN (default on: 32-bit indices, the scale on each row's max, one set of K/V offsets; the old
#     loop's arithmetic, bit-equal under the interpreter; =0 is the old loop), sm_90 SASS (Triton 3.6) at the default
#     launch: 685 -> 534 instructions a 32-key tile in the unmasked loop, 1,037 -> 674 on the diagonal;
#   FLOTILLA_PREFILL_LAZY_RESCALE=tau (default off): rescale the accumulator only when a row's max grew by > tau;
#   FLOTILLA_PREFILL_RECIPROCAL=1 (default off): the output times one reciprocal a row, not divided an element
#     (epilogue 891 -> 515 instructions);
#   FLOTILLA_PREFILL_DEAD_LAST (default on: the same tiles; =0 the old map): the tile map lists each program's
#     (sequence, tile), live tiles first: the step's ~3,900 dead programs (of ~7,900) no longer run ahead of the
#     live ones, and a live one makes two independent loads instead of two dependent ones;
#   and the lean loop at launches session 22's sweep measured before it (128/64/8/3, 128/64/8/2) and
#   at 256-row tiles (64 tokens x 4 heads, 8 warps: 467 instructions a warp a 32-key tile for twice the rows).
# Stages (STAGES, in this order, each under its own limit inside BUDGET_S, default 300 s; rc=124: cut):
#   kernel  bench/prefill_attention.py: every variant at the step's prompt half and at one 2,000-token prompt: us a
#           layer, x32 ms, TFLOP/s, rel_err against the old loop (first variant) and the old loop against the reference;
#   tests   tests/kernels/test_paged_prefill.py + test_mixed_attention.py compiled (the lean and lazy tests included)
#           and two engine tests of greedy tokens through the prefill kernel's new defaults (mixed graphs, the split
#           mixed step, eager and graphs): expect 0 failed;
#   old     bench/mixed_step_profile.py --steps 2 --enforce-eager with FLOTILLA_PREFILL_LEAN=0 and
#           FLOTILLA_PREFILL_DEAD_LAST=0 (the before);
#   lean    the same with the defaults (compare "_prefill_kernel" and "busy" in the step lines);
#   best    the same with the kernel stage's fastest variant at the step's shape (within 2e-2 of the old loop) as
#           switches (FLOTILLA_PREFILL_LEAN / _LAZY_RESCALE / _RECIPROCAL / _LAUNCH, printed); skipped when that is
#           plain `lean` (the default) or `old`, or without kernel.json.
# $OUT: pf23.log (read first: GPU, each stage's rc and key lines), kernel.json, old/lean/best.json.
# Run from the repository root carrying .whl (the pydantic stack), as the other scripts:
#   OUT=... bash bench/results/pf23-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 300
L=$OUT/pf23.log
B=$R/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $L 2>&1
python3 -c "import triton; print('triton', triton.__version__)" >> $L 2>&1
PYTEST="python3 -m pytest -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rs --basetemp=/tmp/pt"
PROFILE="$B/mixed_step_profile.py --decode-rows 448 --prompts 31 --prompt-len 512 --steps 2 --enforce-eager"
best_env() {  # the step shape's fastest variant within 2e-2 of the first, as env assignments ('' for lean / old)
  python3 - "$OUT/kernel.json" <<'PY' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))["shapes"]["step"]["variants"]
ok = {v: r for v, r in rows.items() if "us" in r and r["rel_err_vs_first"] < 2e-2}
best = min(ok, key=lambda v: ok[v]["us"])
k = ok[best]["knobs"]
env = [f"FLOTILLA_PREFILL_LEAN={int(k['lean'])}", f"FLOTILLA_PREFILL_LAZY_RESCALE={k['rescale_tau']:g}",
       f"FLOTILLA_PREFILL_RECIPROCAL={int(k['reciprocal'])}", f"FLOTILLA_PREFILL_DEAD_LAST={int(k['dead_last'])}"]
if "block_m" in k:
    env.append(f"FLOTILLA_PREFILL_LAUNCH={k['block_m']},{k['block_n']},{k['num_warps']},{k['num_stages']}")
print("" if best in ("lean", "old") else " ".join(env))
PY
}
for s in ${STAGES:-kernel tests old lean best}; do
  case $s in
    kernel) run_stage kernel 110 "us a layer|rel_err|error" python3 $B/prefill_attention.py --json $OUT/kernel.json ;;
    tests) run_stage tests 90 "passed|failed|FAILED|assert" $PYTEST $R/tests/kernels/test_paged_prefill.py \
             $R/tests/kernels/test_mixed_attention.py "$R/tests/engine/test_gpu.py::test_cuda_mixed_decode_split_keeps_greedy_tokens" \
             "$R/tests/engine/test_gpu.py::test_cuda_larger_mixed_graphs_keep_greedy_tokens" ;;
    old) run_stage old 45 "^step of|_kernel" env FLOTILLA_PREFILL_LEAN=0 FLOTILLA_PREFILL_DEAD_LAST=0 python3 $PROFILE \
           --json $OUT/old.json ;;
    lean) run_stage lean 45 "^step of|_kernel" python3 $PROFILE --json $OUT/lean.json ;;
    best) BEST=$(best_env)
          if [ -z "$BEST" ]; then echo "=== best: skipped (the fastest variant is lean or old, or no kernel.json)" | tee -a $L
          else echo "best: $BEST" | tee -a $L
            run_stage best 45 "^step of|_kernel" env $BEST python3 $PROFILE --json $OUT/best.json; fi ;;
  esac
done
echo "=== done $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L

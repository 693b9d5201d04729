#!/bin/bash
# Session 35 (helper int4i35): the wide int4 GEMV's tensor-core K step (FLOTILLA_INT4_WIDE_MMA, off by default;
# kernels/triton_int4_mma.py, docs/decode-gemm.md) against its FMA step, for issue 22's int4 ratio (H200 s29: bs1
# ctx 512 2.23 ms against bf16 4.18 = 0.534x; floor <= 0.45x). The FMA step issues ~3.5 sm_90 instructions a weight
# (449 a 16 x 128-word step under Triton 3.6), the MMA step ~1.7 (221): the GEMV was issue-bound near ~2.9 TB/s.
# Never run on a GPU before this script: its first stage checks the PTX on the card (tests) before anything is timed.
# One call on one H100 or H200 (written for the H200), <= 300 s (BUDGET_S 300). From the repository root, carrying .whl:
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s35/int4i.sh
# Without a GPU first (bash -n; py_compile; the interpreter and warp-model tests; both jobs' plumbing on the CPU):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s35/int4i.sh
# Stages (each under its own limit, capped by what is left):
#   tests  (60 s) tests/kernels/test_int4_wide_mma.py on the GPU: the PTX step through the real launches (plain,
#          split-K, PDL peel, gated) against packed_int_linear_ref and the FMA step. A failure here means the MMA
#          numbers below are of a wrong kernel: the summary says so.
#   kernel (85 s) bench/int4_mma_ab.py kernel: qkv / o / gate_up / down alone, checked (symmetric; zero points at
#          o; the gated form at gate_up) then timed off on on off twice. -> kernel.json
#   int4   (130 s) bench/int4_mma_ab.py engine: one int4 W4A16 engine (bench/results/w4a16-model.sh), bs1 ctx 512,
#          phases off on on off (PAIRS=2: twice), 64 graphed steps each, then greedy tokens of both. -> int4.json
#   summary (always) SUMMARY lines on top of int4i.log: tests rc, per-shape us and errors, the step off/on and its
#          ratio to BF16_MS (default 4.18: the H200's bf16 step of session 29; set it from the same card's run).
# $OUT: int4i.log (read first), kernel.json, int4.json, sides.tgz (every stage's output).
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s35
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/int4i.sh bench/results/gpu-env.sh bench/results/w4a16-model.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/int4_mma_ab.py && echo "py_compile: ok" || exit 1
  D=/tmp/int4i35-dry; rm -rf $D; mkdir -p $D
  TRITON_INTERPRET=1 $PY -m pytest -q -p no:cacheprovider --basetemp=$D/pt tests/kernels/test_int4_wide_mma.py 2>&1 \
    | tail -1 || exit 1
  TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/int4_mma_ab.py kernel --cpu-smoke --json $D/k.json \
    | grep "^KERNEL" || exit 1
  $PY bench/model_dirs.py tiny-llama $D/tiny > /dev/null || exit 1
  OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/int4_mma_ab.py engine --cpu-smoke --model $D/tiny --json $D/e.json \
    --steps 2 --pairs 1 | grep "^AB on" && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/int4i35w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-300}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 300
export OMP_NUM_THREADS=1
L=$O/int4i.log; : > $L
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
TESTS_RC=skipped
for s in ${STAGES:-tests kernel int4 summary}; do
  case $s in
    tests) run_stage tests 60 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt $R/tests/kernels/test_int4_wide_mma.py
      TESTS_RC=$? ;;
    kernel) run_stage kernel 85 "^KERNEL" python3 $R/bench/int4_mma_ab.py kernel --json $W/kernel.json --pairs 2
      cp $W/kernel.json $O/ 2>/dev/null ;;
    int4) source $R/bench/results/w4a16-model.sh
      run_stage int4 130 "^AB |phase" python3 $R/bench/int4_mma_ab.py engine --model /tmp/llama8b-w4a16 \
        --json $W/int4.json --steps 64 --pairs ${PAIRS:-1}
      cp $W/int4.json $O/ 2>/dev/null ;;
    summary) python3 - "$W" "$TESTS_RC" "${BF16_MS:-4.18}" > $W/summary.txt 2>&1 <<'PY'
import json, sys
from pathlib import Path
w, tests_rc, bf16 = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
print(f"SUMMARY tests rc={tests_rc}" + ("" if tests_rc == "0" else "  (MMA step NOT verified on this card: numbers below are not evidence)"))
try:
    k = json.loads((w / "kernel.json").read_text())
    for name, r in k["shapes"].items():
        print(f"SUMMARY kernel {name}: mma_taken {r.get('mma_taken')} off {r.get('us_off', float('nan')):.2f} us "
              f"({r.get('gbps_off', float('nan')):.0f} GB/s) on {r.get('us_on', float('nan')):.2f} us "
              f"({r.get('gbps_on', float('nan')):.0f} GB/s); rel_err sym {r.get('rel_err_symmetric', float('nan')):.2e} "
              f"zeros {r.get('rel_err_zeros', float('nan')):.2e} (fma {r.get('rel_err_symmetric_fma', float('nan')):.2e}); "
              f"gated vs fma {r.get('gated_rel_vs_fma_symmetric', float('nan')):.2e}")
except Exception as exc:
    print(f"SUMMARY kernel: no result ({exc!r})")
try:
    e = json.loads((w / "int4.json").read_text())
    ms = e["ms"]
    print(f"SUMMARY int4 bs1 ctx512: off {ms['off']:.3f} ms ({ms['off'] / bf16:.3f}x bf16 {bf16}) on {ms['on']:.3f} ms "
          f"({ms['on'] / bf16:.3f}x); greedy tokens equal {e['tokens_equal']} on {e['device']}")
except Exception as exc:
    print(f"SUMMARY int4: no result ({exc!r})")
PY
      cat $W/summary.txt $L > $W/int4i.log && cp $W/int4i.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

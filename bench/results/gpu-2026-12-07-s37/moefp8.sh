#!/bin/bash
# Session 37 (helper moefp8-37): fp8 experts for mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE; docs/moe.md):
# the fused MoE kernel's fp8 form (kernels/triton_fused_moe.py, W8A16, per-row scales) against its bf16 form at
# Mixtral-8x7B's expert shape (8 experts, top 2, hidden 4096, width 14336), rows 1, 16, 64 and 512. Never run on a
# GPU before this script: its first stage runs the kernel tests on the card (compiled, not interpreted), and every
# timed form is checked against its reference on the card first. One call on one H100 or H200, <= 300 s (BUDGET_S).
# From the repository root, carrying .whl:
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s37/moefp8.sh
# Without a GPU first (bash -n; py_compile; the interpreter tests and the benchmark's interpreter smoke):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s37/moefp8.sh
# Stages (each under its own limit, capped by what is left):
#   tests  (90 s) tests/kernels/test_fused_moe.py and tests/kernels/test_moe.py on the GPU (bf16 and fp8 experts
#          against the reference; masked edges, one decode row). A failure means the numbers below are of a wrong
#          kernel: the summary says so.
#   kernel (120 s) bench/fused_moe_fp8.py --rows 1,16,64,512: bf16 vs fp8 us a call, GB/s of the experts routed to,
#          rel_err of each against its reference. -> moefp8.json
#   summary (always) SUMMARY lines on top of moefp8.log: tests rc, per row count bf16 and fp8 us and their ratio.
# $OUT: moefp8.log (read first), moefp8.json, sides.tgz (every stage's output).
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s37
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/moefp8.sh bench/results/gpu-env.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/fused_moe_fp8.py && echo "py_compile: ok" || exit 1
  D=/tmp/moefp8-dry; rm -rf $D; mkdir -p $D
  TRITON_INTERPRET=1 $PY -m pytest -q -p no:cacheprovider --basetemp=$D/pt tests/kernels/test_fused_moe.py \
    tests/kernels/test_moe.py 2>&1 | tail -1 || exit 1
  TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/fused_moe_fp8.py --cpu-smoke --json $D/s.json \
    | grep "^SMOKE" && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/moefp8w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-300}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 300
L=$O/moefp8.log; : > $L
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
TESTS_RC=skipped
for s in ${STAGES:-tests kernel summary}; do
  case $s in
    tests) run_stage tests 90 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt $R/tests/kernels/test_fused_moe.py \
        $R/tests/kernels/test_moe.py
      TESTS_RC=$? ;;
    kernel) run_stage kernel 120 "^MOEFP8" python3 $R/bench/fused_moe_fp8.py --json $W/moefp8.json \
        --rows ${ROWS:-1,16,64,512}
      cp $W/moefp8.json $O/ 2>/dev/null ;;
    summary) python3 - "$W" "$TESTS_RC" > $W/summary.txt 2>&1 <<'PY'
import json, sys
from pathlib import Path
w, tests_rc = Path(sys.argv[1]), sys.argv[2]
print(f"SUMMARY tests rc={tests_rc}" + ("" if tests_rc == "0" else "  (kernel NOT verified on this card: numbers below are not evidence)"))
try:
    k = json.loads((w / "moefp8.json").read_text())
    print(f"SUMMARY device {k['device']}")
    for r in k["cases"]:
        b, f = r["bf16"], r["fp8"]
        print(f"SUMMARY m{r['rows']} ({r['experts_hit']} experts): bf16 {b['us']:.1f} us ({b['gbps']:.0f} GB/s, rel_err "
              f"{b['rel_err']:.1e}) fp8 {f['us']:.1f} us ({f['gbps']:.0f} GB/s, rel_err {f['rel_err']:.1e}); "
              f"fp8/bf16 {r['fp8_vs_bf16']:.2f}")
except Exception as exc:
    print(f"SUMMARY kernel: no result ({exc!r})")
PY
      cat $W/summary.txt $L > $W/moefp8.log && cp $W/moefp8.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

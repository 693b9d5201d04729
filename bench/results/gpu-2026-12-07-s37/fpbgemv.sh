#!/bin/bash
# Session 37 (helper fpbgemv37): block-scaled fp8 at decode through the per-channel fp8 GEMVs' block forms
# (kernels/dispatch.py `fp8_block_kernel`: one row `triton_fp8_row_gemv.fp8_row_gemv_block`, 2..16 rows
# `triton_gemv.fp8_gemv_block`, the block GEMM above; docs/quantization.md) against the old block GEMM and the
# per-channel fp8 GEMV at Llama-3.1-8B's shapes, rows 1, 4 and 16, 128 x 128 blocks. The decode forms never ran on a
# GPU before this script: its first stage runs their tests on the card (compiled), and every timed variant is checked
# against its reference on the card first. One call on one H100 or H200, <= 240 s (BUDGET_S). From the repository
# root, carrying .whl:
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s37/fpbgemv.sh
# Without a GPU first (bash -n; py_compile; the interpreter tests and the benchmark's interpreter smoke):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s37/fpbgemv.sh
# Stages (each under its own limit, capped by what is left; STAGES="tests kernel summary" by default, `engine` opt-in:
# cold, it took over 70 s in call 3):
#   tests  (90 s) tests/kernels/test_fp8_block_linear.py (the GEMM, the dispatch's choice, the decode forms through the
#          dispatch at 1/3/16 rows, prefetch/PDL/split-K paths) and test_fp8_gemv.py (the per-channel GEMV, whose
#          kernel gained the block constexprs) on the GPU. A failure: the numbers below are of a wrong kernel.
#   engine (opt-in, 90 s) tests/engine/test_fp8_block.py -m gpu: the block-fp8 small Llama on CUDA = CPU's tokens.
#   kernel (130 s) bench/fp8_block_linear.py --rows 1,4,16 --no-bf16: block (the dispatch: the decode forms),
#          block_gemm (the old path), channel_gemv, channel_dispatch; us and GB/s a call, rel_err. -> fpbgemv.json
#   summary (always) SUMMARY lines on top of fpbgemv.log: tests rc, per shape and rows the new block path's us, the
#          old GEMM's, the per-channel GEMV's and dispatch's, the ratios, rel_err.
# $OUT: fpbgemv.log (read first), fpbgemv.json, sides.tgz (every stage's output).
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s37
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/fpbgemv.sh bench/results/gpu-env.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/fp8_block_linear.py && echo "py_compile: ok" || exit 1
  D=/tmp/fpbgemv37-dry; rm -rf $D; mkdir -p $D
  TRITON_INTERPRET=1 $PY -m pytest -q -p no:cacheprovider --basetemp=$D/pt tests/kernels/test_fp8_block_linear.py 2>&1 \
    | tail -1 || exit 1
  TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/fp8_block_linear.py --cpu-smoke --json $D/s.json \
    | grep "^SMOKE" && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/fpbgemv37w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-240}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 240
L=$O/fpbgemv.log; : > $L
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
TESTS_RC=skipped; ENGINE_RC=skipped
for s in ${STAGES:-tests kernel summary}; do
  case $s in
    tests) run_stage tests 90 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt $R/tests/kernels/test_fp8_block_linear.py \
        $R/tests/kernels/test_fp8_gemv.py
      TESTS_RC=$? ;;
    engine) run_stage engine 90 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt-engine -m gpu $R/tests/engine/test_fp8_block.py
      ENGINE_RC=$? ;;
    kernel) run_stage kernel 130 "^FPBLOCK" python3 $R/bench/fp8_block_linear.py --json $W/fpbgemv.json \
        --rows ${ROWS:-1,4,16} --no-bf16
      cp $W/fpbgemv.json $O/ 2>/dev/null ;;
    summary) python3 - "$W" "$TESTS_RC" "$ENGINE_RC" > $W/summary.txt 2>&1 <<'PY'
import json, sys
from pathlib import Path
w, tests_rc, engine_rc = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
nan = float("nan")
print(f"SUMMARY tests rc={tests_rc}" + ("" if tests_rc == "0" else "  (kernels NOT verified on this card: numbers below are not evidence)"))
print(f"SUMMARY engine (CUDA greedy tokens = CPU's) rc={engine_rc}")
try:
    k = json.loads((w / "fpbgemv.json").read_text())
    print(f"SUMMARY device {k['device']}")
    for r in k["cases"]:
        b, g, c, d = r["block"], r["block_gemm"], r["channel_gemv"], r["channel_dispatch"]
        print(f"SUMMARY {r['name']} m{r['m']} ({r['kernel']}): block {b.get('us', nan):.1f} us "
              f"({b.get('gbps', nan):.0f} GB/s, rel_err {b.get('rel_err', nan):.1e}) old gemm {g.get('us', nan):.1f} us "
              f"channel_gemv {c.get('us', nan):.1f} us channel_dispatch {d.get('us', nan):.1f} us; "
              f"block/channel_gemv {b.get('vs_channel_gemv', nan):.2f} block/channel_dispatch "
              f"{b.get('vs_channel_dispatch', nan):.2f} gemm/block {b.get('gemm_speedup', nan):.2f}"
              f"{'  ERROR ' + b['error'] if 'error' in b else ''}")
except Exception as exc:
    print(f"SUMMARY kernel: no result ({exc!r})")
PY
      cat $W/summary.txt $L > $W/fpbgemv.log && cp $W/fpbgemv.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

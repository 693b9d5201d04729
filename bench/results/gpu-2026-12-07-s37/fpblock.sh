#!/bin/bash
# Session 37 (helper fpblock37): the block-scaled fp8 GEMM (kernels/triton_fp8_block_linear.py; Qwen3-*-FP8 /
# DeepSeek weight_block_size and compressed-tensors FP8_BLOCK checkpoints, run W8A16; docs/quantization.md) against
# the per-channel fp8 GEMV at Llama-3.1-8B's shapes, rows 1, 16 and 64, 128 x 128 blocks. Never run on a GPU before
# this script: its first stage runs the kernel tests on the card (compiled, not interpreted), and every timed variant
# is checked against its reference on the card first. One call on one H100 or H200, <= 300 s (BUDGET_S). From the
# repository root, carrying .whl:
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s37/fpblock.sh
# Without a GPU first (bash -n; py_compile; the interpreter tests and the benchmark's interpreter smoke):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s37/fpblock.sh
# Stages (each under its own limit, capped by what is left):
#   tests  (60 s) tests/kernels/test_fp8_block_linear.py on the GPU (default tiles at 1/5/20/70 rows, partial blocks,
#          split K, the dispatch). A failure means the numbers below are of a wrong kernel: the summary says so.
#   engine (70 s) tests/engine/test_fp8_block.py -m gpu: a block-fp8 small Llama (hidden 512) served on CUDA in fp32
#          with CUDA graphs gives the CPU engine's greedy tokens (the kernel in every layer, decode and prefill).
#   kernel (150 s) bench/fp8_block_linear.py --rows 1,16,64 (SWEEP=1: --sweep, a few other tiles; more time):
#          block vs channel_gemv / channel_dispatch / bf16_cublas, us and GB/s a call, rel_err. -> fpblock.json
#   summary (always) SUMMARY lines on top of fpblock.log: tests and engine rc, per shape and rows the block kernel's
#          us, its ratio to the per-channel GEMV, its rel_err against the reference.
# $OUT: fpblock.log (read first), fpblock.json, sides.tgz (every stage's output).
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s37
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/fpblock.sh bench/results/gpu-env.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/fp8_block_linear.py && echo "py_compile: ok" || exit 1
  D=/tmp/fpblock37-dry; rm -rf $D; mkdir -p $D
  TRITON_INTERPRET=1 $PY -m pytest -q -p no:cacheprovider --basetemp=$D/pt tests/kernels/test_fp8_block_linear.py 2>&1 \
    | tail -1 || exit 1
  $PY -m pytest -q -p no:cacheprovider --collect-only -m gpu tests/engine/test_fp8_block.py 2>&1 | tail -1 || exit 1
  TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/fp8_block_linear.py --cpu-smoke --json $D/s.json \
    | grep "^SMOKE" && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/fpblock37w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-300}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 300
L=$O/fpblock.log; : > $L
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
TESTS_RC=skipped; ENGINE_RC=skipped
for s in ${STAGES:-tests engine kernel summary}; do
  case $s in
    tests) run_stage tests 60 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt $R/tests/kernels/test_fp8_block_linear.py
      TESTS_RC=$? ;;
    engine) run_stage engine 70 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt-engine -m gpu $R/tests/engine/test_fp8_block.py
      ENGINE_RC=$? ;;
    kernel) run_stage kernel 150 "^FPBLOCK" python3 $R/bench/fp8_block_linear.py --json $W/fpblock.json --rows 1,16,64 \
        ${SWEEP:+--sweep}
      cp $W/fpblock.json $O/ 2>/dev/null ;;
    summary) python3 - "$W" "$TESTS_RC" "$ENGINE_RC" > $W/summary.txt 2>&1 <<'PY'
import json, sys
from pathlib import Path
w, tests_rc, engine_rc = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"SUMMARY tests rc={tests_rc}" + ("" if tests_rc == "0" else "  (kernel NOT verified on this card: numbers below are not evidence)"))
print(f"SUMMARY engine (CUDA greedy tokens = CPU's) rc={engine_rc}")
try:
    k = json.loads((w / "fpblock.json").read_text())
    print(f"SUMMARY device {k['device']}")
    for r in k["cases"]:
        b, c, d = r["block"], r["channel_gemv"], r["channel_dispatch"]
        print(f"SUMMARY {r['name']} m{r['m']}: block {b.get('us', float('nan')):.1f} us ({b.get('gbps', float('nan')):.0f} "
              f"GB/s, rel_err {b.get('rel_err', float('nan')):.1e}) channel_gemv {c.get('us', float('nan')):.1f} us "
              f"channel_dispatch {d.get('us', float('nan')):.1f} us; block/channel_gemv "
              f"{b.get('vs_channel_gemv', float('nan')):.2f}{'  ERROR ' + b['error'] if 'error' in b else ''}")
except Exception as exc:
    print(f"SUMMARY kernel: no result ({exc!r})")
PY
      cat $W/summary.txt $L > $W/fpblock.log && cp $W/fpblock.log $L; cat $W/summary.txt ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

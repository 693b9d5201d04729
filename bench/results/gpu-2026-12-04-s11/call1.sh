#!/bin/bash
# Session 11, device call 1: main as merged (PDL at one row + the int4 wide GEMV by default, first time together on
# a GPU), then two kept diffs from session 10 applied to `git archive`s of main in .scratch/<name>:
#   layout  = branch-notes/qgemv10-layout.diff (the int4 wide GEMV's Triton-3.6 layout fix): per-projection GEMV grid
#   rowacc  = branch-notes/audit10-gemv-row-acc.diff (FLOTILLA_GEMV_ROW_ACC=1): bf16 + fp8 one-row GEMV A/B
# Run from the repository root, carrying .whl and .scratch:  bash bench/results/gpu-2026-12-04-s11/call1.sh
T0=$SECONDS; ROOT=$PWD; FINAL=$OUT; W=/tmp/o1; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call1.log; }
pack() { tar czf $FINAL/call1-$1.tgz -C $W $1 $1.stdout 2>/dev/null; }
run_in() {  # tree name budget command... (tree '.' = main)
  local tree=$1 name=$2 budget=$3; shift 3
  [ "$tree" != . ] && ln -sfn $ROOT/.whl $ROOT/$tree/.whl
  stage $name
  (cd $tree && OUT=$W/$name BUDGET_S=$budget timeout $((budget + 10)) bash -c "$*") > $W/$name.stdout 2>&1
  pack $name
}
run_in . dec 85 "STAGES='on summary' SIDE_S=70 bash bench/results/dec7-gpu.sh"
run_in . int4 150 "STAGES='new bf16 summary' bash bench/results/qgemv10-gpu.sh"
run_in . tests 45 'source bench/results/gpu-env.sh 45; timeout $(left 45) python3 -m pytest -q -p no:cacheprovider -m gpu \
  -c $R/pyproject.toml --rootdir=$R $R/tests/kernels/test_pdl.py $R/tests/kernels/test_int4_gemv_wide.py \
  $R/tests/kernels/test_gemv.py > $OUT/tests.log 2>&1; tail -15 $OUT/tests.log'
run_in .scratch/layout layout 75 "STAGES='gemv summary' bash bench/results/qgemv10-gpu.sh"
run_in .scratch/rowacc rowacc 95 'source bench/results/gpu-env.sh 95
  for a in 0 1; do
    FLOTILLA_GEMV_ROW_ACC=$a timeout $(left 25) python3 $R/bench/kernels.py --out $OUT/gemv-acc$a.json --sections gemv --gemv-rows 1 > $OUT/gemv-acc$a.log 2>&1; echo "kernels acc=$a rc=$?"
    FLOTILLA_GEMV_ROW_ACC=$a timeout $(left 22) python3 $R/bench/fp8_gemv.py --json $OUT/fp8-acc$a.json --rows 1 > $OUT/fp8-acc$a.log 2>&1; echo "fp8 acc=$a rc=$?"
  done; tail -n 30 $OUT/*.log'
stage done

#!/bin/bash
# Session 10, device call 2, on main: the fp8 KV default's GPU kernel tests (call 1 cut them at 30 s) and the
# offline run with its step trace (bench/results/offline10-gpu.sh).
T0=$SECONDS; FINAL=$OUT; W=/tmp/o2; mkdir -p $W
stage() { echo "=== $1 $(date +%T) ($((SECONDS - T0)) s in)" | tee -a $FINAL/call2.log; }
stage kvtests
(source bench/results/gpu-env.sh 90 && timeout 80 python3 -m pytest $R/tests/kernels/test_paged_decode.py \
  $R/tests/kernels/test_fp8_kv_cache.py -m gpu -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R) \
  > $FINAL/call2-kvtests.log 2>&1; tail -5 $FINAL/call2-kvtests.log | tee -a $FINAL/call2.log
stage offline10
(OUT=$W/offline10 BUDGET_S=170 timeout 180 bash bench/results/offline10-gpu.sh) > $W/offline10.stdout 2>&1
tar czf $FINAL/call2-offline10.tgz -C $W offline10 offline10.stdout
stage done

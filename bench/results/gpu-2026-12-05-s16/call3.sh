#!/bin/bash
# Session 16, call 3 (ran on an H100: the device lent no H200): same-call bf16 baseline for the fp8 bs1 A/B of call 2,
# then int4g15's script, then the offline 1,000 x 512/128 run of main. From the repository root of main, carrying
# .whl, .scratch/fp8g15 and .scratch/int4g15 (rebuilt by bench/results/gpu-2026-12-05-s15/prep.sh):
#   OUT=... bash bench/results/gpu-2026-12-05-s16/call3.sh
R0=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O/ab $O/int4 $O/offline
ln -sfn $R0/.whl $R0/.scratch/fp8g15/.whl; ln -sfn $R0/.whl $R0/.scratch/int4g15/.whl
( cd .scratch/fp8g15 && source bench/results/gpu-env.sh 150
  CFG='6144x4096:bn=8,p=3;4096x4096:bn=16,bk=1024;4096x14336:bn=16,bk=1024'
  for spec in "bf16|" "fp8main|--quantization fp8" "fp8new|--quantization fp8" "bf16b|"; do
    label=${spec%%|*}; args=${spec#*|}; envs="FLOTILLA_FP8_ROW_GEMV=0"
    [ $label = fp8new ] && envs="FLOTILLA_FP8_ROW_GEMV=1 FLOTILLA_FP8_ROW_GEMV_CONFIG=$CFG"
    echo "=== $label $(date +%T) ($((END - SECONDS)) s left) $envs $args"
    env $envs timeout $(left 45) python3 $R/bench/decode_ab.py --label $label $args --batch-sizes 1 --token-batch 1 \
      --context 512 --json $O/ab/$label.json > $O/ab/$label.log 2>&1; echo "rc=$?"
    grep -E "^$label:" $O/ab/$label.log | tail -3 | cut -c1-300
  done ) > $O/ab/ab.txt 2>&1
( cd .scratch/int4g15 && OUT=$O/int4 BUDGET_S=230 timeout 240 bash bench/results/int4g15-gpu.sh ) > $O/int4.stdout 2>&1
cd $R0 && OUT=$O/offline BUDGET_S=170 timeout 180 bash bench/results/offline10-gpu.sh > $O/offline.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; cat $O/ab/ab.txt; tail -30 $O/int4.stdout; tail -25 $O/offline/offline10.log; } > $O/summary.txt
cd $O && tar czf call3.tgz ab int4 offline int4.stdout offline.stdout && rm -rf ab int4 offline *.stdout
cat $O/summary.txt

#!/bin/bash
# Issue 25 (multi-LoRA) on the H200 — NOT RUN YET (no device time in the session that wrote it).
# Stages: the LoRA kernel tests compiled on the GPU (tests/kernels/test_lora.py against the PyTorch
# reference), then bench/lora.py: Llama-3.1-8B shape (dummy bf16 weights), rank-16 adapters on all
# seven projections, batch 1 and 64 at context 512, 8 distinct adapters; the targets are
# <= 1.15x (batch 1) and <= 1.25x (batch 64) the no-LoRA step.
# Run from the repository root on the H200 machine, carrying .whl as bench/results/gpu-2026-12-03.sh
# does (pydantic 2.14.4 + pydantic-core cp312, annotated-types, typing-inspection, typing-extensions;
# no HTTP stack needed). Each stage has its own limit inside a whole-call deadline (BUDGET_S).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$PWD; END=$((SECONDS + ${BUDGET_S:-540}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn $R/engine /tmp/p/flotilla/engine && ln -sfn $R/kernels /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p:$R/bench PYTHONUNBUFFERED=1
L=$OUT/lora-gpu.log
left() { local l=$((END - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
cd /tmp  # `python -m flotilla...` from the repository root would import the source flotilla/ (FACTS)
for s in ${STAGES:-kernels bench}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    kernels) timeout $(left 120) python3 -m pytest $R/tests/kernels/test_lora.py -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -5 | tee -a $L ;;
    bench) (cd $R/bench && timeout $(left 400) python3 lora.py --shape llama-3.1-8b --rank 16 --adapters 8 --batch-sizes 1,64 --context 512 --steps 32 --json $OUT/lora-gpu.json 2>&1 | grep -v INFO | tail -6 | tee -a $L) ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

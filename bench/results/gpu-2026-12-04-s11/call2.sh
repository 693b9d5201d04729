#!/bin/bash
# Session 11, device call 2: branch overlap11 @b74c3cd (from a `git archive` in .scratch/overlap11): the
# two-micro-batch overlap probe (bench/overlap_probe.py via bench/results/overlap11-gpu.sh).
#   bash bench/results/gpu-2026-12-04-s11/call2.sh   (carrying .whl and .scratch)
ROOT=$PWD; ln -sfn $ROOT/.whl $ROOT/.scratch/overlap11/.whl
cd .scratch/overlap11 && OUT=$OUT BUDGET_S=110 timeout 120 bash bench/results/overlap11-gpu.sh > $OUT/overlap11.stdout 2>&1
tail -50 $OUT/overlap11.log

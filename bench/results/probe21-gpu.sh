#!/bin/bash
# Session 21, helper probe21 (issue 19: offline 1,000 x 512/128 >= 0.80 of the FLOP bound; 0.65 on an H100): can a
# decode step's GEMMs and its paged attention overlap on this GPU at all, before NanoFlow-style nano-batches go into
# the engine? bench/overlap_probe.py at Llama-3.1-8B's layer shapes (random bf16, the engine's kernels through
# kernels/dispatch.py, shuffled block tables), 32 layers, context 576: for R = 488 and 244 decode rows (a) the GEMM
# chain, (b) the attention, (c) both serially, (d) two nano-batches of R/2 on two streams (attention calls taking
# turns: the half-layer offset; (d') the same with every attention on a third stream), each eager (CUDA events) and
# CUDA-graphed, with overlap fractions (a + b - concurrent) / min(a, b); then (e) a 16,384-token GEMM chain beside
# 449 rows' attention (a mixed step); then session 11's variants (--extras: row chunks, stream priorities,
# cuBLAS SM carve-outs of 16/32/48). Session 11 measured R = 512 on the H200: no overlap.
# One call (BUDGET_S, default 240 s): the probe under `timeout` (its JSON, summary included, is rewritten after every
# case, so a cut run keeps what it measured).
# $OUT (2 files): probe21.log (read first: GPU and versions, the SUMMARY block, then the probe's whole output),
# probe21.json (every time, the overlap fractions, the summary lines).
# Run from the repository root carrying .whl (the pydantic stack, as bench/results/http-speed-gpu.sh's header lists):
#   OUT=... bash bench/results/probe21-gpu.sh
# PROBE_ARGS replaces the probe's options (default: --extras), e.g. PROBE_ARGS="--rows 488 --mixed-tokens 0".
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 240
W=/tmp/probe21; rm -rf $W; mkdir -p $W; L=$OUT/probe21.log
{ nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $W/head.txt 2>&1
cat $W/head.txt
lim=$(left 230); echo "=== probe $(date +%T) limit $lim s" | tee $W/run.log
timeout $lim python3 $R/bench/overlap_probe.py --out $OUT/probe21.json ${PROBE_ARGS:---extras} 2>&1 | tee -a $W/run.log
echo "rc=${PIPESTATUS[0]} ($((END - SECONDS)) s left)" | tee -a $W/run.log
python3 -c "import json, sys; print('\n'.join(json.load(open(sys.argv[1]))['summary']))" $OUT/probe21.json \
  > $W/summary.txt 2>&1
cat $W/head.txt $W/summary.txt $W/run.log > $L
echo "=== SUMMARY"; cat $W/summary.txt

#!/bin/bash
# Session 34 (helper gpuprep34): batch-1 decode attention's serial chain, for issue 19's bf16 bs1 ctx 512 floor
# (H200 s29: 4.18 ms, floor <= 4.05), its attention floor (bs1 x 4,096: 1,744 GB/s, floor >= 2,000) and issue 22's
# int4 ratio (0.534x, floor <= 0.45x; the int4 step runs the same attention). On the H200 one 64-key tile a program
# took 6.79 us against four tiles' 10.26 (s25 call 2, b1fix / b1e): ~1.15 us a tile, a round trip each, because the
# key loop reads the next tile's page numbers from the block table in every iteration and the next copy waits for
# them. Two levers, both off by default (kernels/triton_paged_decode.py, docs/decode-gemm.md):
#   "pages" (flag of FLOTILLA_DECODE_SMALL_LAUNCH; `SPLIT_TILES`): a split's page numbers read up front, no table
#           read in the loop; the same numbers bit for bit (tests/kernels/test_paged_decode.py -k pages);
#   FLOTILLA_DECODE_SHORT_LAUNCH (`_SHORT_LAUNCH`): a launch of its own for block tables <= 1,024 tokens (the
#           context-512 engine's 704), e.g. one 64-key tile a program.
# One call on one H100 or H200 (written for the H200), ~300 s (BUDGET_S 320). From the repository root, carrying .whl:
#   OUT=$OUT bash bench/results/gpu-2026-12-07-s34/attn.sh
# Without a GPU first (bash -n; py_compile; the picks on made-up JSON; every candidate launch under the Triton
# interpreter against the reference and "pages" bit-equal to the plain loop; the engine A/B's plumbing on the CPU
# with a tiny model; ~2 min on a loaded CPU):
#   DRY=1 PY=.venv/bin/python bash bench/results/gpu-2026-12-07-s34/attn.sh
# Stages (BUDGET_S, default 320 s; each under its own limit, capped by what is left):
#   kernel (90 s) bench/early_query_ab.py --shapes e1s,e1k,b1e,b1fix --plain-only: the kernel alone (Llama-3.1-8B
#          heads, bf16 pool, pages shuffled past the L2, CUDA graphs of 100 calls), every launch A B B A twice: e1s
#          context 530 in the context-512 engine's 704-token table, e1k in the server's 1,024 bucket (main's launch,
#          SHORT_CANDIDATES, PAGES_CANDIDATES), b1e the floor's shape (4,160 in 4,288: B1_LAUNCHES, PAGES_CANDIDATES),
#          b1fix one tile a program. -> kernel.json
#   bf16   (100 s) bench/small_launch_ab.py: one engine (random bf16, max_model_len 704), main against
#          SMALL=<the fastest "pages" launch at b1e> and SHORT=<the fastest one-tile launch at e1s> (attn_pick.py
#          variants), main B1 B2 B2 B1 main twice, 64 graphed bs1 ctx 512 steps a phase, then greedy tokens. -> bf16.json
#   int4   (70 s) the same in the int4 W4A16 engine (bench/results/w4a16-model.sh's checkpoint), once. -> int4.json
#   summary (always) attn_pick.py summary: SUMMARY lines (kernel rows, the 2,000 GB/s floor, each A/B, the 4.05 ms
#          floor, the int4 ratio) and `ADOPT ...` or `ADOPT nothing` on top of attn.log
#   tests  (40 s, with what is left) the decode kernel's CUDA-graph replay tests (-m gpu), `pages_ahead` among them:
#          the rc and pass/fail line land in attn.log (after the summary), the output in sides.tgz
# $OUT (5 files): attn.log (read first), kernel.json, bf16.json, int4.json, sides.tgz (every stage's output).
# VARIANTS="SMALL=...;SHORT=..." with STAGES="bf16 int4 summary" times given launches without the kernel stage.
set -o pipefail
HERE_REL=bench/results/gpu-2026-12-07-s34
if [ "${DRY:-}" = 1 ]; then
  PY=${PY:-python3}
  for f in $HERE_REL/attn.sh bench/results/gpu-env.sh bench/results/w4a16-model.sh; do
    bash -n "$f" && echo "bash -n $f: ok" || exit 1
  done
  $PY -m py_compile bench/early_query_ab.py bench/small_launch_ab.py $HERE_REL/attn_pick.py && echo "py_compile: ok" \
    || exit 1
  $PY $HERE_REL/attn_pick.py selftest | tail -1 || exit 1
  TRITON_INTERPRET=1 $PY -m pytest -q -p no:cacheprovider --basetemp=/tmp/attn34-dry tests/kernels/test_paged_decode.py \
    -k "short or pages or small_launch" 2>&1 | tail -1 || exit 1
  M=/tmp/attn34-dry/tiny; rm -rf $M; $PY bench/model_dirs.py tiny-llama $M > /dev/null || exit 1
  OMP_NUM_THREADS=1 PYTHONPATH=bench $PY bench/small_launch_ab.py --cpu-smoke --model $M \
    --json /tmp/attn34-dry/smoke.json --variants "SMALL=64,4,3,256,fused+dep+pages;SHORT=64,4,3,64,fused+dep" \
    --steps 2 --pairs 1 | grep "^AB best" && echo "DRY: ok"
  exit
fi
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/attn34w; rm -rf $W; mkdir -p $W
# gpu-env.sh: wheels, the package path, END, left, run_stage (which writes $OUT/STAGE.out: here the work folder)
export OUT=$W BUDGET_S=${BUDGET_S:-320}
source "$(dirname "${BASH_SOURCE[0]}")/../gpu-env.sh" 320
export OMP_NUM_THREADS=1
L=$O/attn.log; : > $L
PICK="python3 $R/$HERE_REL/attn_pick.py"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L
for s in ${STAGES:-kernel bf16 int4 summary tests}; do
  case $s in
    kernel) run_stage kernel 90 "^BEST|^e1s|^b1e|compiled" python3 $R/bench/early_query_ab.py --json $W/kernel.json \
        --shapes e1s,e1k,b1e,b1fix --no-floors --pairs 2 --plain-only --workers 12
      cp $W/kernel.json $O/ 2>/dev/null ;;
    bf16) python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
      V=${VARIANTS:-$($PICK variants $W/kernel.json)}; echo "variants: $V" | tee -a $L
      run_stage bf16 100 "^AB |left out" python3 $R/bench/small_launch_ab.py --model /tmp/llama8b \
        --json $W/bf16.json --variants "$V" --steps 64 --pairs 2
      cp $W/bf16.json $O/ 2>/dev/null ;;
    int4) source $R/bench/results/w4a16-model.sh
      V=${VARIANTS:-$($PICK variants $W/kernel.json)}
      run_stage int4 70 "^AB |left out" python3 $R/bench/small_launch_ab.py --model /tmp/llama8b-w4a16 \
        --json $W/int4.json --variants "$V" --steps 64 --pairs 1
      cp $W/int4.json $O/ 2>/dev/null ;;
    summary) $PICK summary $W > $W/summary.txt 2>&1
      cat $W/summary.txt $L > $W/attn.log && cp $W/attn.log $L; cat $W/summary.txt ;;
    tests) run_stage tests 40 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -c $R/pyproject.toml --rootdir=$R --basetemp=/tmp/pt -m gpu $R/tests/kernels/test_paged_decode.py \
        -k "replays_in_a_graph" ;;
  esac
done
(cd $W && tar czf $O/sides.tgz *.out 2>/dev/null)
echo "=== done $(date +%T) ($((END - SECONDS)) s left)"

# The stage scaffolding of a bench/results/*-gpu.sh call that times its subject against a bf16 baseline in its own
# process of the same call (int4f20-gpu.sh, tile20-gpu.sh), sourced after gpu-env.sh:
#   source "$(dirname "${BASH_SOURCE[0]}")/bf16-stages.sh" NAME WORKDIR
# It empties WORKDIR (as W), starts $OUT/NAME.log (as L: the GPU line and versions, then each stage's lines; the
# summary is put at its top by `summary_first`) and $OUT/NAME-sides.log (as S: every stage's whole output), and defines
#   stage_head STAGE      "=== STAGE <time> (<s> s left)" into L
#   stage_tail RC LOG RE N WIDTH
#                         after a stage's command: "rc=RC" into L, LOG appended to S, LOG's last N lines matching the
#                         regex RE (cut to WIDTH characters) into L
#   bf16_stage LIMIT      bench/decode_ab.py with bf16 defaults, the bs1 ctx 512 step (a ratio's denominator) ->
#                         $W/bf16.json, under LIMIT s (capped by what is left)
#   summary_first         the last lines: "=== done", then $W/summary.txt moved to the TOP of L (a call cut before
#                         it leaves the stage lines alone in L)
# A summary's Python reads the stages' JSON with bench/stage_runs.py (`load_runs`, `bf16_bs1`, `bf16_line`).
W=$2; rm -rf $W; mkdir -p $W; L=$OUT/$1.log; S=$OUT/$1-sides.log; : > $L; : > $S
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> $L 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L 2>&1

stage_head() { echo "=== $1 $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L; }

stage_tail() {
  echo "rc=$1" | tee -a $L
  cat $2 >> $S
  grep -E "$3" $2 | tail -$4 | cut -c1-$5 | tee -a $L
}

bf16_stage() {
  echo "--- bf16 $(date +%T) limit $(left $1) s" | tee -a $L >> $S
  timeout $(left $1) python3 $R/bench/decode_ab.py --label bf16 --batch-sizes 1 --token-batch 1 --tokens 4 \
    --profile-batch-sizes "" --json $W/bf16.json > $W/bf16.log 2>&1
  stage_tail $? $W/bf16.log "^bf16:|Traceback|Error" 4 300
}

summary_first() {
  echo "=== done $(date +%T)" >> $L
  { cat $W/summary.txt 2>/dev/null; echo; echo "--- stages"; cat $L; } > $W/final.log && cp $W/final.log $L
}

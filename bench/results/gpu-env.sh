# The environment every bench/results/*-gpu.sh script starts from on the H200 machine, sourced as its first
# command (from the repository root, as the scripts run):
#   source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" DEFAULT_BUDGET_S
# It sets:
#   OUT    the folder results go to (the device call's $OUT; /tmp/out otherwise), created and exported
#   R      the repository root (the working directory the script was started in)
#   END    the whole call's deadline in $SECONDS: BUDGET_S (or the given default, else 600) from now
#   left N prints N, or the seconds left before END when fewer (a stage's `timeout` limit)
#   run_stage STAGE LIMIT PATTERN CMD...  runs CMD under `timeout $(left LIMIT)` into $OUT/STAGE.out (skipped when
#          under 15 s are left), appending its rc and the output's lines matching PATTERN (or a traceback) to the
#          log $L the script set; returns CMD's rc
# and lays out the Python path: the carried wheels (.whl/*.whl: pydantic stack, HTTP stack, ... as each
# script's header lists) installed into /tmp/site without their dependencies, and the `flotilla` package as
# it installs (flotilla/*.py copied, engine/ and kernels/ linked as flotilla.engine / flotilla.kernels) in
# /tmp/p; bench/ is on the path too, so scripts import model_dirs, report, latency, ...
# Then it changes to /tmp: `python -m flotilla...` started from the repository root would import the source
# flotilla/ folder (no engine/ inside) instead of /tmp/p/flotilla (FACTS, 2026-12-03); scripts use $R/...
set -u
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=$PWD; END=$((SECONDS + ${BUDGET_S:-${1:-600}}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn "$R/engine" /tmp/p/flotilla/engine \
  && ln -sfn "$R/kernels" /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p:$R/bench PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
left() { local l=$((END - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
run_stage() {
  local stage=$1 lim=$2 pat=$3; shift 3
  echo "=== $stage $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; return 1; }
  timeout $(left $lim) "$@" > $OUT/$stage.out 2>&1
  local rc=$?
  echo "rc=$rc" | tee -a $L
  grep -E "$pat|Traceback|Error" $OUT/$stage.out | tail -40 | cut -c1-400 | tee -a $L
  return $rc
}
cd /tmp || exit 1

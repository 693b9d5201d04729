#!/bin/bash
# Prepares the "A" tree of bench/results/tp1-ab-gpu.sh on this machine (the device gets a copy of the working tree
# without .git, so the base commit travels as files):
#   bash bench/results/make-ab-base.sh [COMMIT]      (default c5415da, see below)
# extracts `git archive COMMIT` of flotilla/, engine/, kernels/ and bench/*.py into .ab-base/ (ignored by git; the
# device call carries it: carry [".whl", ".ab-base"]), writes the full commit id to .ab-base/COMMIT, and checks here
# that the base tree imports as the `flotilla` package (laid out as gpu-env.sh lays out the current tree:
# flotilla/*.py copied, engine/ and kernels/ linked as flotilla.engine and flotilla.kernels).
# The default base, c5415da (2026-12-03 11:30), is main just before `Merge branch 'tp'` (a2386cd): the last main
# commit before the multi-process executor and tensor/pipeline parallelism (fe6fcec, engine/executor.py,
# engine/worker.py) landed; its engine/ equals that of 8724317, the parent of fe6fcec.
set -eu
COMMIT=${1:-c5415da}
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab-base
mkdir -p .ab-base
git archive "$COMMIT" flotilla engine kernels 'bench/*.py' | tar -x -C .ab-base
git rev-parse "$COMMIT^{commit}" > .ab-base/COMMIT
LAYOUT=$(mktemp -d)
trap 'rm -rf "$LAYOUT"' EXIT
mkdir -p "$LAYOUT/flotilla"
cp .ab-base/flotilla/*.py "$LAYOUT/flotilla/"
ln -s "$PWD/.ab-base/engine" "$LAYOUT/flotilla/engine"
ln -s "$PWD/.ab-base/kernels" "$LAYOUT/flotilla/kernels"
# From another directory, so the source flotilla/ of this checkout cannot shadow the layout.
(cd "$LAYOUT" && PYTHONPATH="$LAYOUT:$OLDPWD/.ab-base/bench" "${PYTHON:-$OLDPWD/.venv/bin/python}" -c "
import os, flotilla.engine.llm_engine, latency
engine = os.path.realpath(flotilla.engine.llm_engine.__file__)
assert engine.startswith('$OLDPWD/.ab-base/engine/'), engine
print('base tree imports:', engine, latency.__file__)")
echo ".ab-base/ holds $(cat .ab-base/COMMIT) ($(du -sh .ab-base | cut -f1))"

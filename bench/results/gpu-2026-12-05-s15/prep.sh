#!/bin/bash
# Rebuild session 15's unmeasured GPU branches for a device call, on the CPU machine, from the repository root:
# .scratch/<name> = `git archive` of the main commit the branch last merged + the branch's diff (branch-notes/),
# i.e. exactly the branch head's tree (the branch refs fp8g15 / kv15 / int4g15 may be gone in a fresh clone).
# Then the calls, in priority order, each carrying .whl and its trees (each tree ~15 MB; a call carries <= 64 MiB):
#   A: OUT=... bash bench/results/gpu-2026-12-05-s15/call1.sh                          (main's figures, ~560 s)
#   B: N=2 BRANCHES="fp8g15:240 kv15:240" bash bench/results/gpu-2026-12-04-s12/branches.sh
#      carry [".whl", ".scratch/fp8g15", ".scratch/kv15"]
#   C: N=3 BRANCHES="int4g15:240" bash bench/results/gpu-2026-12-04-s12/branches.sh
#      carry [".whl", ".scratch/int4g15"]
# (.scratch/ and .whl/ must be git-ignored, e.g. listed in .git/info/exclude, or every tree travels with every call.)
# (branches.sh writes $OUT/callN.log and $OUT/callN-<branch>.tgz.) Each branch's notes (what it prints, what to
# merge and which default to flip if faster) are branch-notes/<name>.md.
set -eu
D=bench/results/gpu-2026-12-05-s15/branch-notes
for spec in fp8g15:bc91f25 kv15:51b5c9c int4g15:bc91f25; do
  IFS=: read -r b base <<< "$spec"
  rm -rf .scratch/$b && mkdir -p .scratch/$b
  git archive "$base" | tar x -C .scratch/$b
  patch -d .scratch/$b -p1 -s --forward < $D/$b.diff
  bash -n .scratch/$b/bench/results/$b-gpu.sh && echo "$b: ok (from $base)"
done

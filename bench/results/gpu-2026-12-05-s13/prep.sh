#!/bin/bash
# Rebuild every unmeasured helper branch (sessions 12 and 13) for a device call, on the CPU machine, from the
# repository root: .scratch/<name> = `git archive` of the main commit the branch last merged + its diff (exactly
# the branch head's tree); prefix12's tools are on main, so .scratch/prefix12 is HEAD's tree.
# The calls, in priority order (README.md here says why), each carrying .whl and only its two trees
# (carry [".whl", ".scratch/A", ".scratch/B"]: each tree is ~13 MB, a call carries at most 64 MiB):
#   N=1 BRANCHES="int4v13:200 fp8w12:200" bash bench/results/gpu-2026-12-04-s12/branches.sh
#   N=2 BRANCHES="norm12:200 attn13:200"  bash bench/results/gpu-2026-12-04-s12/branches.sh
#   N=3 BRANCHES="attn12:180 gated12:180" bash bench/results/gpu-2026-12-04-s12/branches.sh
#   N=4 BRANCHES="rope12:180 prefix12:180" bash bench/results/gpu-2026-12-04-s12/branches.sh
# (branches.sh writes $OUT/callN.log and $OUT/callN-<branch>.tgz; OUT is the device's output folder.)
set -eu
S12=bench/results/gpu-2026-12-04-s12/branch-notes
S13=bench/results/gpu-2026-12-05-s13/branch-notes
for spec in attn12:107dcbe:$S12 fp8w12:107dcbe:$S12 norm12:b94fedb:$S12 gated12:2e5c330:$S12 rope12:2e5c330:$S12 \
            attn13:4be12f4:$S13 int4v13:1462fc0:$S13 prefix12:HEAD:-; do
  IFS=: read -r b base dir <<< "$spec"
  rm -rf .scratch/$b && mkdir -p .scratch/$b
  git archive "$base" | tar x -C .scratch/$b
  if [ "$dir" != - ]; then patch -d .scratch/$b -p1 -s --forward < $dir/$b.diff; fi
  bash -n .scratch/$b/bench/results/$b-gpu.sh && echo "$b: ok (from $base)"
done

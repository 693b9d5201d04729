#!/bin/bash
# Rebuild this session's unmeasured helper branches for a device call, on the CPU machine, from the repository
# root: .scratch/<name> = `git archive` of the main commit the branch was last merged with + branch-notes/<name>.diff
# (exactly the branch head's tree); prefix12's tools and script are on main, so .scratch/prefix12 is HEAD's tree.
# Then run them, three calls (the per-call limit is 600 s), each carrying .whl and only its branches' trees
# (carry [".whl", ".scratch/norm12", ".scratch/fp8w12"], ...: each tree is ~13 MB, a call carries at most 64 MiB):
#   N=2 BRANCHES="norm12:200 fp8w12:200" bash bench/results/gpu-2026-12-04-s12/branches.sh
#   N=3 BRANCHES="attn12:200 prefix12:200" bash bench/results/gpu-2026-12-04-s12/branches.sh
#   N=4 BRANCHES="gated12:200 rope12:200" bash bench/results/gpu-2026-12-04-s12/branches.sh
set -eu
D=bench/results/gpu-2026-12-04-s12/branch-notes
for spec in attn12:107dcbe fp8w12:107dcbe norm12:b94fedb gated12:2e5c330 rope12:2e5c330 prefix12:HEAD; do
  b=${spec%%:*} base=${spec##*:}
  rm -rf .scratch/$b && mkdir -p .scratch/$b
  git archive "$base" | tar x -C .scratch/$b
  if [ "$b" != prefix12 ]; then patch -d .scratch/$b -p1 -s --forward < $D/$b.diff; fi
  bash -n .scratch/$b/bench/results/$b-gpu.sh && echo "$b: ok (from $base)"
done

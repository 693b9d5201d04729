#!/bin/bash
# Session 19's fourth device call, main after http19 + prefix19 (host path) were merged:
#   http:    offline vs `flotilla serve` through HTTP, 512 streams (issue 19's 90 % floor)          ~170 s
#   off19:   offline 1,000 x 512/128 at --max-num-batched-tokens 4,096 and 2,048 (graphs to the budget),
#            against http's offline stage at 16,384 (the same command without the trace)          ~150 s
#   prefix:  cached 2,000-token prefix TTFT, prefix7-gpu.sh's "on" stage                          ~70 s
# From the repository root, carrying .whl:   OUT=... bash bench/results/gpu-2026-12-05-s19/call4.sh
O=${OUT:-/tmp/out}; mkdir -p $O/http $O/off19 $O/prefix
OUT=$O/http BUDGET_S=230 STAGES="offline serve-on" bash bench/results/http6-gpu.sh > $O/http.stdout 2>&1
OUT=$O/off19 BUDGET_S=170 OFF19="4096@4096 2048@2048" bash bench/results/offline19-gpu.sh > $O/off19.stdout 2>&1
OUT=$O/prefix BUDGET_S=90 STAGES="on" bash bench/results/prefix7-gpu.sh > $O/prefix.stdout 2>&1
{ nvidia-smi --query-gpu=name --format=csv,noheader; grep -hE "output tok/s|fraction_of_bound|\.api:" $O/http/*.log;
  grep -hE "^=== |RESULT" $O/off19/offline19.log; grep -h "^on:" $O/prefix/*.log; } > $O/summary.txt 2>&1
cd $O && tar czf call4.tgz http off19 prefix *.stdout && rm -rf http off19 prefix *.stdout
cat $O/summary.txt

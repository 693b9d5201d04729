#!/bin/bash
# Session 27, helper samp27: the sampler's noise (engine/sampler.py exponential_noise / race) after it moved to in-place
# passes in two buffers (on the CPU by row chunks in per-thread buffers; on CUDA one chunk in fresh memory). One call
# (BUDGET_S, default 150 s), no model, each stage in its own process under its own limit:
#   noise  (60 s) on CUDA, B 1/16/64/256 x V 49,152 and 128,256: exponential_noise against the former out-of-place
#          formula (the same SplitMix64 helpers): bit-equal or not, and the median ms of each (CUDA-synchronised)
#   micro  (60 s) bench/sampling_cost.py --device cuda: sample() at temperature 0.8 (seeded, unseeded, top-p 0.9),
#          64 rows x V 128,256, median ms a call
# Expect: every "equal True"; new ms <= old ms (fewer kernels, no per-op allocation). $OUT: samp27.log (read
# first), noise.out, micro.out, micro.json. Run from the repository root carrying .whl (the pydantic stack):
#   OUT=... BUDGET_S=150 bash bench/results/samp27-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 150
L=$OUT/samp27.log; : > $L
nvidia-smi --query-gpu=name --format=csv,noheader >> $L 2>&1
run_stage noise 60 "^noise" python3 - <<'PY'
import time, torch
from flotilla.engine.sampler import _GOLDEN, _mix64, _shr, exponential_noise
def old(seeds, positions, vocab):  # the formula before session 27: a fresh tensor per operation
    row = _mix64(seeds * _GOLDEN + positions)
    tokens = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _mix64(row.unsqueeze(1) + (tokens.unsqueeze(0) + 1) * _GOLDEN)
    v = ((_shr(bits, 11) + 1).float() * 2.0**-53).clamp_(max=1.0 - 2.0**-24)
    return -torch.log1p(-v)
def ms(fn, *a):
    fn(*a); torch.cuda.synchronize(); t = []
    for _ in range(20):
        s = time.perf_counter(); fn(*a); torch.cuda.synchronize(); t.append(time.perf_counter() - s)
    return sorted(t)[10] * 1e3
for vocab in (49152, 128256):
    for rows in (1, 16, 64, 256):
        g = torch.Generator().manual_seed(rows)
        seeds = torch.randint(0, 2**62, (rows,), generator=g).cuda()
        pos = torch.randint(0, 4096, (rows,), generator=g).cuda()
        eq = torch.equal(old(seeds, pos, vocab), exponential_noise(seeds, pos, vocab))
        print(f"noise V {vocab} B {rows}: equal {eq}  old {ms(old, seeds, pos, vocab):.3f} ms"
              f"  new {ms(exponential_noise, seeds, pos, vocab):.3f} ms", flush=True)
PY
run_stage micro 60 "^micro" python3 $R/bench/sampling_cost.py --parts micro --device cuda --rows 64 --vocab 128256 \
  --calls 30 --out $OUT/micro.json

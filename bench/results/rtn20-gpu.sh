#!/bin/bash
# rtn20: the fp32 rtn 4-bit LoRA test's CUDA/CPU divergence was rtn_quantize dividing by a Python number (CUDA: a
# product with the fp32 reciprocal; CPU: exact division), which moved the extreme code of a third of the groups.
# On a GPU this checks (1) the old formula's CUDA/CPU difference directly (the diagnosis: expect thousands of scales
# and codes differing), (2) the fixed rtn_quantize bit-equal on both devices, (3) the failing test, fp32 and bf16,
# in its own pytest process. ~3 min. From the repository root, carrying .whl (the pydantic stack):
#   OUT=... bash bench/results/rtn20-gpu.sh
source bench/results/gpu-env.sh 400
python3 - > $OUT/old-formula.txt 2>&1 <<'PY'
import torch
g = torch.Generator().manual_seed(0)
w = torch.randn(2048, 512, generator=g) * 0.02
for dev in ("cpu", "cuda"):
    x = w.to(dev).reshape(2048, -1, 32)
    s = x.abs().amax(-1, keepdim=True) * 2.0 / 15
    c = ((x / s).round() + 8).clamp(0, 15)
    globals()[dev] = (s.cpu(), c.cpu())
print("old formula: scales differing", int((cpu[0] != cuda[0]).sum()), "of", cpu[0].numel(),
      "codes differing", int((cpu[1] != cuda[1]).sum()))
PY
cat $OUT/old-formula.txt
T="python3 -m pytest -m gpu -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R -q -rfE --tb=short"
timeout $(left 120) $T "$R/tests/engine/test_quantization.py::test_cuda_rtn_rounds_as_the_cpu" > $OUT/rounds.log 2>&1
echo "rc=$?" >> $OUT/rounds.log; tail -3 $OUT/rounds.log
timeout $(left 240) $T "$R/tests/engine/lora/test_lora_graphs.py::test_cuda_lora_on_rtn4_layers" > $OUT/lora-rtn4.log 2>&1
echo "rc=$?" >> $OUT/lora-rtn4.log; tail -5 $OUT/lora-rtn4.log

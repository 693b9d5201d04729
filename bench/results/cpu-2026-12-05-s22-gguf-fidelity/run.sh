#!/bin/bash
# Session 22: the GGUF Q4_1 codes' fidelity against the bf16 model, re-run on today's tree, and why it moved from
# session 10's 97.08 % / -0.28 % (bf16) to 97.21 % / -0.37 %: session 11's Q8_0 LM head as codes
# (FLOTILLA_GGUF_CPU_HEAD, default on; =0: the dense bf16 head of session 10). See README.md here.
# Usage, from the repository root after `make setup`: bash bench/results/cpu-2026-12-05-s22-gguf-fidelity/run.sh
set -eu
OUT=${OUT:-bench/results/cpu-2026-12-05-s22-gguf-fidelity}
PY=.venv/bin/python
export OMP_NUM_THREADS=1
fidelity() {  # NAME DTYPE [ENV=VALUE...]: one quant_fidelity run of the GGUF variant, its JSON and its log
  local name=$1 dtype=$2
  shift 2
  env "$@" $PY bench/quant_fidelity.py --dtype "$dtype" --variants 'GGUF Q4_1 codes' --json "$OUT/$name.json" \
    | tee "$OUT/$name.log"
}
fidelity gguf-bf16 bfloat16                                  # the served path (the README's figure)
fidelity gguf-bf16-dense-head bfloat16 FLOTILLA_GGUF_CPU_HEAD=0  # session 10's path: the head dense in bf16
fidelity gguf-fp32 float32                                   # the weights alone (the head is dense in fp32)
# The two heads side by side: their weights, and where their teacher-forced top-1 choices differ
$PY - <<'PY' | tee "$OUT/head-diff.log"
import glob
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, "bench")
from quant_fidelity import score  # noqa: E402

from flotilla.engine.embedded_model import embedded_gguf_path, embedded_model_dir  # noqa: E402
from flotilla.engine.quantization.gguf import _reader, dequantize_tensor, unpack_q8_blocks  # noqa: E402

path, base = str(embedded_gguf_path()), str(embedded_model_dir())
raw = np.asarray({t.name: t for t in _reader(path).tensors}["token_embd.weight"].data)
codes, d = unpack_q8_blocks(raw)
exact = codes.float() * d.repeat_interleave(32, dim=1)  # the file's values
dense = dequantize_tensor(raw, "Q8_0").to(torch.bfloat16).float()  # bf16(d q): session 10's head
planes = codes.float() * d.to(torch.bfloat16).float().repeat_interleave(32, dim=1)  # q bf16(d): the codes head
ref = {k: v for f in glob.glob(base + "/*.safetensors") for k, v in load_file(f).items()}["model.embed_tokens.weight"]
print("bf16 model's head == bf16(d q):", torch.equal(ref.float(), dense))
print(f"head weights that differ, bf16(d q) vs q bf16(d): {(dense != planes).float().mean().item():.2%}")
print(f"mean |w - d q|: bf16(d q) {(dense - exact).abs().mean().item():.3e}, "
      f"q bf16(d) {(planes - exact).abs().mean().item():.3e}")
ref_top1, _ = score(base, "bfloat16")
os.environ["FLOTILLA_GGUF_CPU_HEAD"] = "0"
dense_top1, dense_ppl = score(path, "bfloat16", tokenizer=base)
os.environ["FLOTILLA_GGUF_CPU_HEAD"] = "1"
codes_top1, codes_ppl = score(path, "bfloat16", tokenizer=base)
print(f"positions {len(ref_top1)}; dense head vs codes head: top-1 differs at "
      f"{sum(a != b for a, b in zip(dense_top1, codes_top1))}")
print(f"differ from the bf16 model: dense head {sum(a != b for a, b in zip(dense_top1, ref_top1))} "
      f"(ppl {dense_ppl:.3f}), codes head {sum(a != b for a, b in zip(codes_top1, ref_top1))} (ppl {codes_ppl:.3f})")
PY

#!/bin/bash
# Issue 22 on the H200 (NOT RUN YET: written 2026-12-03 without device time). Stages:
#   tests   the fp8 KV and int4 GEMM kernel tests compiled on the GPU, and the torch._scaled_mm path against the
#           fp32 reference (fp8_linear_scaled_mm vs fp8_linear_ref, Llama-3.1-8B projection shapes)
#   decode  decode step latency, Llama-3.1-8B shape (random weights, --load-format dummy), batch 1,
#           context 512: bf16, --quantization fp8, --kv-cache-dtype fp8, both, int4 W4A16 g128; the step is
#           (time of 512-in/129-out - time of 512-in/1-out) / 128 through the offline LLM
#   blocks  KV blocks at gpu-memory-utilization 0.9 with auto vs fp8 KV (expect ~2x)
# Run from the repository root on the H200 machine, carrying .whl as bench/results/gpu-2026-12-03.sh
# (pydantic stack); PYTHONPATH=/tmp/site:/tmp/p as there.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$PWD; END=$((SECONDS + ${BUDGET_S:-540}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/p/flotilla && cp flotilla/*.py /tmp/p/flotilla/ && ln -sfn $R/engine /tmp/p/flotilla/engine && ln -sfn $R/kernels /tmp/p/flotilla/kernels
export PYTHONPATH=/tmp/site:/tmp/p:$R/bench PYTHONUNBUFFERED=1
L=$OUT/quant-gpu.log
left() { local l=$((END - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
cd /tmp
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
# The same shape as a compressed-tensors W4A16 (int4, group 128, symmetric) checkpoint: random codes
# under --load-format dummy, detected from config.json.
mkdir -p /tmp/llama8b-w4a16 && cp /tmp/llama8b/* /tmp/llama8b-w4a16/ && python3 - <<'PY'
import json
p = "/tmp/llama8b-w4a16/config.json"; c = json.load(open(p))
c["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}}
json.dump(c, open(p, "w"))
PY
for s in ${STAGES:-tests decode blocks}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 20 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    tests) timeout $(left 150) python3 -m pytest $R/tests/kernels/test_fp8_kv_cache.py $R/tests/kernels/test_int4_gemm.py $R/tests/kernels/test_kv_write.py $R/tests/kernels/test_rotary_kv_write.py -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R 2>&1 | tail -5 | tee -a $L
      timeout $(left 60) python3 - <<'PY' 2>&1 | tail -6 | tee -a $L
import torch
from flotilla.kernels.fp8_linear import fp8_linear_ref, quantize_fp8_rows
from flotilla.kernels.fp8_scaled_mm import fp8_linear_scaled_mm
g = torch.Generator(device="cuda").manual_seed(0)
for m, n, k in [(1, 6144, 4096), (64, 4096, 4096), (512, 28672, 4096)]:
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w8, ws = quantize_fp8_rows(torch.randn(n, k, device="cuda", generator=g) * 0.02)
    out, ref = fp8_linear_scaled_mm(x, w8, ws), fp8_linear_ref(x, w8, ws)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"_scaled_mm vs reference m={m} n={n} k={k}: rel err {err:.2e} ({'ok' if err < 1e-2 else 'FAIL'})")
PY
      ;;
    decode) timeout $(left 300) python3 - <<'PY' 2>&1 | grep -v INFO | tail -6 | tee -a $L
import json, time
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
prompt = [[7] * 512]
res = {}
for name, kw in [("bf16", {}), ("fp8", {"quantization": "fp8"}), ("fp8-kv", {"kv_cache_dtype": "fp8"}),
                 ("fp8+fp8-kv", {"quantization": "fp8", "kv_cache_dtype": "fp8"}), ("int4-w4a16", {"model": "/tmp/llama8b-w4a16"})]:
    path = kw.pop("model", "/tmp/llama8b")
    llm = LLM(path, load_format="dummy", max_model_len=4096, **kw)
    def run(n):
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        t = time.perf_counter(); llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t
    step = (run(129) - run(1)) / 128
    res[name] = {"step_ms": step * 1e3, "num_blocks": llm.engine.runner.num_blocks}
    print(name, f"{step * 1e3:.2f} ms/step", "blocks", llm.engine.runner.num_blocks, f"ratio to bf16 {step * 1e3 / res['bf16']['step_ms']:.2f}")
    del llm
json.dump(res, open("/tmp/out/quant-gpu-decode.json", "w"), indent=1)
PY
      ;;
    blocks) grep -h "KV cache" $L | tail -4 ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L
# Targets from issue 22: decode (bs 1, ctx 512) <= 0.62x bf16 for fp8, <= 0.45x for int4; fp8 KV 2.0x the blocks.

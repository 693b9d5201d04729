#!/bin/bash
# Issue 22 on the H200, one call (BUDGET_S, default 290 s of device time). Stages, each under its own limit:
#   tests   the fp8 KV / int4 GEMM / KV write kernel tests compiled on the GPU, and torch._scaled_mm against the
#           fp32 reference (fp8_linear_scaled_mm vs fp8_linear_ref) at Llama-3.1-8B projection shapes
#   bf16 fp8 fp8kv int4 both
#           bench/quant_gpu.py, one process per configuration (an engine's KV pool is only returned to the GPU
#           when its process ends: the 13:17 run OOMed reusing one process), Llama-3.1-8B shape with random
#           weights: decode step at batch 1 / context 512 (all), at batch 64 / context 4,096 (bf16, fp8kv),
#           offline 1,000 x (512 in / 128 out) (bf16, fp8), KV blocks at gpu-memory-utilization 0.9 (all)
#   summary ratios against bf16 and the issue's targets -> $OUT/quant-gpu-summary.json
# Targets (issue 22): step bs1 ctx512 <= 0.62x bf16 for fp8, <= 0.45x for int4; fp8 KV 2.0x the blocks and the
# bs64 x ctx4096 step <= 0.70x the bf16-KV step; offline output tok/s >= 1.35x bf16 for fp8.
# Run from the repository root on the H200 machine, carrying .whl as bench/results/gpu-2026-12-03.sh
# (pydantic stack); PYTHONPATH=/tmp/site:/tmp/p as there:
#   BUDGET_S=290 bash bench/results/quant-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 290
L=$OUT/quant-gpu.log
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
# name: stage limit (s) | model | quant_gpu.py arguments
conf() {
  case $1 in
    bf16)  echo "75 /tmp/llama8b --jobs bs1,bs64,throughput" ;;
    fp8)   echo "60 /tmp/llama8b --quantization fp8 --jobs bs1,throughput" ;;
    fp8kv) echo "45 /tmp/llama8b --kv-cache-dtype fp8 --jobs bs1,bs64" ;;
    int4)  echo "35 /tmp/llama8b-w4a16 --weights int4 --jobs bs1" ;;
    both)  echo "35 /tmp/llama8b --quantization fp8 --kv-cache-dtype fp8 --jobs bs1" ;;
  esac
}
for s in ${STAGES:-tests bf16 fp8 fp8kv int4 both summary}; do
  echo "=== $s $(date +%T) ($((END - SECONDS)) s left)" | tee -a $L
  [ $((END - SECONDS)) -lt 15 ] && { echo "skipped: out of time" | tee -a $L; continue; }
  case $s in
    tests) timeout $(left 40) python3 -m pytest $R/tests/kernels/test_fp8_kv_cache.py $R/tests/kernels/test_int4_gemm.py $R/tests/kernels/test_kv_write.py $R/tests/kernels/test_rotary_kv_write.py -q -p no:cacheprovider -c $R/pyproject.toml --rootdir=$R > $OUT/quant-gpu-tests.log 2>&1
      grep -E "Error|error:|passed|failed" $OUT/quant-gpu-tests.log | tail -12 | tee -a $L
      timeout $(left 25) python3 - <<'PY' 2>&1 | tail -6 | tee -a $L
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
    summary) python3 - <<'PY' 2>&1 | tee -a $L
import json, os
out = os.environ.get("OUT", "/tmp/out")
runs = {}
for name in ["bf16", "fp8", "fp8kv", "int4", "both"]:
    try:
        runs[name] = json.load(open(f"{out}/quant-gpu-{name}.json"))
    except (OSError, ValueError) as e:
        runs[name] = {"error": str(e)}
base = runs["bf16"]
def ratio(name, key, field):
    try:
        return runs[name][key][field] / base[key][field]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
summary = {"runs": runs, "ratios": {
    "step_bs1_fp8": [ratio("fp8", "bs1", "ms_per_step"), "<= 0.62"],
    "step_bs1_int4": [ratio("int4", "bs1", "ms_per_step"), "<= 0.45"],
    "step_bs1_fp8kv": [ratio("fp8kv", "bs1", "ms_per_step"), None],
    "step_bs1_fp8_fp8kv": [ratio("both", "bs1", "ms_per_step"), None],
    "step_bs64_ctx4096_fp8kv": [ratio("fp8kv", "bs64", "ms_per_step"), "<= 0.70"],
    "kv_blocks_fp8kv": [runs["fp8kv"].get("num_blocks", 0) / base["num_blocks"] if base.get("num_blocks") else None, "2.0"],
    "offline_output_tok_s_fp8": [ratio("fp8", "throughput", "output_tokens_per_s"), ">= 1.35"],
}}
json.dump(summary, open(f"{out}/quant-gpu-summary.json", "w"), indent=1)
for name, r in runs.items():
    line = [name, f"blocks {r.get('num_blocks')}", f"startup {r.get('startup_s', 0):.0f} s"]
    for job in ("bs1", "bs64"):
        if job in r:
            line.append(f"{job} {r[job]['ms_per_step']:.2f} ms/step (roofline {r[job]['roofline_ms']:.2f})")
    if "throughput" in r:
        line.append(f"offline {r['throughput']['output_tokens_per_s']:.0f} out tok/s")
    print("  ".join(line) if "error" not in r else f"{name}: {r['error']}")
for k, (v, target) in summary["ratios"].items():
    print(f"{k}: {'n/a' if v is None else f'{v:.3f}'} (target {target})")
PY
      ;;
    *) set -- $(conf $s)
      lim=$1 model=$2; shift 2
      timeout $(left $lim) python3 $R/bench/quant_gpu.py --model $model --name $s "$@" --json $OUT/quant-gpu-$s.json > $OUT/quant-gpu-$s.log 2>&1
      echo "rc=$?" | tee -a $L
      grep -E "KV cache:|Error|error" $OUT/quant-gpu-$s.log | tail -4 | tee -a $L ;;
  esac
done
echo "=== done $(date +%T)" | tee -a $L

# Sourced by the GPU scripts that need it (quant-gpu.sh, int4g-gpu.sh), after gpu-env.sh: writes /tmp/llama8b (the
# Llama-3.1-8B shape, bench/model_dirs.py) and /tmp/llama8b-w4a16, the same shape as a compressed-tensors W4A16
# checkpoint (int4, group 128, symmetric): random codes under --load-format dummy, detected from config.json.
python3 $R/bench/model_dirs.py llama-3.1-8b /tmp/llama8b > /dev/null
mkdir -p /tmp/llama8b-w4a16 && cp /tmp/llama8b/* /tmp/llama8b-w4a16/ && python3 - <<'PY'
import json
p = "/tmp/llama8b-w4a16/config.json"; c = json.load(open(p))
c["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}}
json.dump(c, open(p, "w"))
PY

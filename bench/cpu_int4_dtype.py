"""torch's packed int4 CPU kernel by activation dtype, against dense matmuls (the GGUF codes path's choice of dtype).

The embedded model's linear layers (SmolLM2-135M: per layer qkv 576->960, o 576->576, gate_up 576->3072, down
1536->576; all 30 layers, each its own weights, so a pass reads them from memory as a decode step does), from the
shipped Q4_1 GGUF: its codes in torch's int4 layout (scale d, bias m + 8 d, `engine/quantization/gguf.py`) with
bf16 / fp16 / fp32 activations, and the same weights dense in bf16 and fp32. Each line: milliseconds for one pass
over the 30 layers' matmuls at `rows` rows (1: a decode step of one stream, 8: of eight), median of --repeats
passes, torch threads as given; and the largest difference from the float32 product with the file's exact weights
(gguf's dequantize), relative to that product's largest value (bf16 rows include the activations' rounding).
Then the weights alone: how far the bf16 int4 path's and the bf16 model's weights are from the file's, over every
linear tensor.

    python bench/cpu_int4_dtype.py --threads 1 --json bench/results/cpu-2026-12-04-s10-gguf/int4-dtype-t1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from flotilla.engine.embedded_model import embedded_gguf_path
from flotilla.engine.quantization import gguf as gguf_q
from flotilla.kernels.cpu_int_linear import cpu_int4_affine_weight, cpu_int_linear

LAYERS = 30


def layer_weights() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every layer's four matmuls as (codes, d, m, exact fp32 weight), q/k/v and gate/up stacked as the engine
    does: 30 layers of distinct weights, so each pass reads them from memory as a decode step does."""
    tensors = {t.name: t for t in gguf_q._reader(str(embedded_gguf_path())).tensors}
    out = []
    for layer in range(LAYERS):
        for names in (["attn_q", "attn_k", "attn_v"], ["attn_output"], ["ffn_gate", "ffn_up"], ["ffn_down"]):
            parts = [np.asarray(tensors[f"blk.{layer}.{n}.weight"].data) for n in names]
            unpacked = [gguf_q.unpack_q4_blocks(p, "Q4_1") for p in parts]
            out.append((torch.cat([u[0] for u in unpacked]), torch.cat([u[1] for u in unpacked]),
                        torch.cat([u[2] for u in unpacked]),
                        torch.cat([gguf_q.dequantize_tensor(p, "Q4_1") for p in parts])))
    return out


def weight_rounding() -> dict[str, float]:
    """Over every Q4_1 tensor of the file: how far the weights the bf16 int4 path computes (`(q - 8) * bf16(d) +
    bf16(m + 8 d)`, in float32 as the kernel dequantizes) and the bf16 model's (`bf16(d q + m)`) are from the file's
    exact values: RMS error over RMS weight, and the largest error in units of its block's step `d`."""
    sq = {"int4 bf16 scale/bias": 0.0, "bf16 dense": 0.0}
    worst = dict.fromkeys(sq, 0.0)
    total = 0.0
    for tensor in gguf_q._reader(str(embedded_gguf_path())).tensors:
        if tensor.tensor_type.name != "Q4_1":
            continue
        raw = np.asarray(tensor.data)
        codes, d, m = gguf_q.unpack_q4_blocks(raw, "Q4_1")
        exact = gguf_q.dequantize_tensor(raw, "Q4_1")
        rows = codes.shape[0]
        kernel = ((codes.float() - 8).reshape(rows, -1, 32) * d.bfloat16().float()[..., None]
                  + (d * 8 + m).bfloat16().float()[..., None]).reshape(rows, -1)
        step = d.abs().repeat_interleave(32, 1).clamp(min=1e-12)
        for name, weight in (("int4 bf16 scale/bias", kernel), ("bf16 dense", exact.bfloat16().float())):
            sq[name] += ((weight - exact) ** 2).sum().item()
            worst[name] = max(worst[name], ((weight - exact).abs() / step).max().item())
        total += (exact**2).sum().item()
    out = {}
    for name in sq:
        out[f"{name}: rms error / rms weight"] = (sq[name] / total) ** 0.5
        out[f"{name}: max error / block step d"] = worst[name]
        print(f"{name:<21}: RMS error / RMS weight {(sq[name] / total) ** 0.5:.2e}, largest error "
              f"{worst[name]:.3f} of its block's step d")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weights = layer_weights()
    results = {"threads": args.threads, "loadavg_before": os.getloadavg(), "rows": {}}
    for rows in (1, 8):
        xs = [torch.randn(rows, w[0].shape[1]) for w in weights]
        exact = [x @ w[3].t() for x, w in zip(xs, weights, strict=True)]
        line = {}
        for name, dtype, packed in (("int4 bf16", torch.bfloat16, True), ("int4 fp16", torch.float16, True),
                                    ("int4 fp32", torch.float32, True), ("dense bf16", torch.bfloat16, False),
                                    ("dense fp32", torch.float32, False)):
            if packed:
                ops = [cpu_int4_affine_weight(c, d, d * 8 + m, 32, dtype) for c, d, m, _ in weights]
                calls = [(lambda x, op=op: cpu_int_linear(x, op)) for op in ops]
            else:
                dense = [w[3].to(dtype) for w in weights]
                calls = [(lambda x, w=w: x @ w.t()) for w in dense]
            inputs = [x.to(dtype) for x in xs]
            error = max(((call(x).float() - e).abs().max() / e.abs().max()).item()
                        for call, x, e in zip(calls, inputs, exact, strict=True))
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for call, x in zip(calls, inputs, strict=True):
                    call(x)
                times.append((time.perf_counter() - start) * 1e3)
            line[name] = {"ms_per_model_pass": statistics.median(times), "max_rel_error_vs_exact": error}
            print(f"rows {rows} {name:<10}: {statistics.median(times):7.2f} ms per pass of 30 layers, "
                  f"max |error| / max |y| {error:.1e}", flush=True)
        results["rows"][str(rows)] = line
    results["weight_rounding"] = weight_rounding()
    results["loadavg_after"] = os.getloadavg()
    print(f"load average before {results['loadavg_before']}, after {results['loadavg_after']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

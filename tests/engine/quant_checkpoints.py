"""Quantized test checkpoints of tiny HF models, written with the formats' own tools where they install.

- compressed-tensors: the `compressed-tensors` library computes each scheme's scales and zero points
  (`calculate_qparams`) and packs the weights with its own compressor, and decompresses them again for
  the oracle: HF transformers run on the decompressed (dequantized) weights.
- GPTQ and AWQ: their tools need CUDA, so `pack_gptq` / `pack_awq` write the published layouts from
  the same integer codes; tests check both packers against hand-computed words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from flotilla.engine.quantization.awq import AWQ_ORDER
from flotilla.kernels.packed_int_linear import pack_codes


def _linear_names(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]


def compressed_tensors_checkpoint(
    src: Path, dst: Path, preset: str, group_size: int | None = None, dequantized_copy: bool = True,
    static_scale: float = 0.05,
) -> Path:
    """`src` (an HF directory) quantized with compressed-tensors preset `preset` (W4A16, W4A16_ASYM,
    W8A16, FP8_DYNAMIC, FP8, W8A8 (int8, format int-quantized), or W8A8_STATIC: W8A8 with static per-tensor
    activations; `group_size` overrides the preset's; `static_scale`: every layer's static input scale) into
    `dst`, plus `dst/dequantized`: the same model with the library's decompressed weights, for HF to run as the
    oracle."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    scheme = preset_name_to_scheme(preset.removesuffix("_STATIC") if preset == "W8A8_STATIC" else preset, ["Linear"])
    if preset == "W8A8_STATIC":
        scheme.input_activations = scheme.input_activations.model_copy(update={"strategy": "tensor",
                                                                               "dynamic": False})
    if group_size is not None:
        scheme.weights.group_size = group_size
    fmt = "float-quantized" if scheme.weights.type == "float" else \
        "int-quantized" if scheme.input_activations is not None else "pack-quantized"
    compressor = BaseCompressor.load_from_registry(fmt)
    state = {k: v for k, v in model.state_dict().items()}
    dequantized = dict(state)
    for name in _linear_names(model):
        weight = state.pop(f"{name}.weight")
        local = {"weight": weight, **_qparams(weight, scheme.weights, calculate_qparams)}
        if scheme.input_activations is not None and not scheme.input_activations.dynamic:
            local["input_scale"] = torch.tensor([static_scale])  # a fixed static scale: the test's choice
        packed = compressor.compress(local, scheme)
        state.update({f"{name}.{k}": v for k, v in packed.items()})
        dequantized[f"{name}.weight"] = compressor.decompress(dict(packed), scheme)["weight"].float()
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=["lm_head"])
    _save(model, src, dst, state, config.model_dump(exclude_none=True))
    if not dequantized_copy:
        return dst
    model.load_state_dict(dequantized)
    model.save_pretrained(dst / "dequantized")
    AutoTokenizer.from_pretrained(src).save_pretrained(dst / "dequantized")
    return dst


def _qparams(weight: torch.Tensor, args: Any, calculate_qparams: Any) -> dict[str, torch.Tensor]:
    strategy = str(args.strategy.value if hasattr(args.strategy, "value") else args.strategy)
    rows = weight.shape[0]
    if strategy == "group":
        grouped = weight.reshape(rows, -1, args.group_size)
        lo, hi = grouped.amin(dim=-1), grouped.amax(dim=-1)
    elif strategy == "channel":
        lo, hi = weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True)
    else:  # tensor
        lo, hi = weight.amin().reshape(1), weight.amax().reshape(1)
    scale, zero = calculate_qparams(lo, hi, args)
    return {"weight_scale": scale, "weight_zero_point": zero}


def _save(model: torch.nn.Module, src: Path, dst: Path, state: dict[str, torch.Tensor], qcfg: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    dst.mkdir(parents=True, exist_ok=True)
    if model.config.tie_word_embeddings:  # safetensors refuses shared storage; HF re-ties on load
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = qcfg
    (dst / "config.json").write_text(json.dumps(config, default=str))
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


def int4_codes(weight: torch.Tensor, group: int, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric `bits`-bit (4 unless said) min/max quantization: (codes `[out, in]`, scales `[out, groups]`, zeros
    `[out, groups]`) with `weight ~= (codes - zeros) * scales` per group."""
    top = 2**bits - 1
    grouped = weight.reshape(weight.shape[0], -1, group)
    lo, hi = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    scales = ((hi - lo) / top).clamp(min=1e-8)
    zeros = (-lo / scales).round().clamp(0, top)
    codes = (grouped / scales[..., None] + zeros[..., None]).round().clamp(0, top)
    return codes.reshape(weight.shape).to(torch.int32), scales, zeros.to(torch.int32)


def pack_gptq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int = 4) -> dict[str, torch.Tensor]:
    """GPTQ v1 tensors of one layer: qweight packed along inputs `[in * bits / 32, out]`, qzeros (zero - 1)
    packed along outputs `[groups, out * bits / 32]`, scales `[groups, out]`, g_idx."""
    group = codes.shape[1] // scales.shape[1]
    return {
        "qweight": pack_codes(codes, bits).t().contiguous(),
        "qzeros": pack_codes((zeros - 1).t().contiguous() & (2**bits - 1), bits),
        "scales": scales.t().contiguous().half(),
        "g_idx": torch.arange(codes.shape[1], dtype=torch.int32) // group,
    }


def pack_awq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    """AWQ GEMM tensors of one layer: qweight `[in, out/8]` and qzeros `[groups, out/8]` packed along
    outputs in AWQ's order, scales `[groups, out]`."""

    def interleave(x: torch.Tensor) -> torch.Tensor:  # [rows, cols] -> nibble i of word k = col 8k + ORDER[i]
        return pack_codes(x.reshape(x.shape[0], -1, 8)[:, :, list(AWQ_ORDER)].reshape(x.shape[0], -1), 4)

    return {
        "qweight": interleave(codes.t().contiguous()),
        "qzeros": interleave(zeros.t().contiguous()),
        "scales": scales.t().contiguous().half(),
    }


def int4_checkpoint(src: Path, dst: Path, fmt: str, group: int = 32, bits: int = 4) -> Path:
    """`src` quantized to asymmetric int4 (gptq: also int8) in `fmt` (gptq or awq), plus `dst/dequantized` for HF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    state = dict(model.state_dict())
    dequantized = dict(state)
    for name in _linear_names(model):
        codes, scales, zeros = int4_codes(state.pop(f"{name}.weight"), group, bits)
        scales = scales.half().float()  # the checkpoint stores fp16 scales
        packed = pack_gptq(codes, scales, zeros, bits) if fmt == "gptq" else pack_awq(codes, scales, zeros)
        state.update({f"{name}.{k}": v for k, v in packed.items()})
        expand = lambda t: t.float().repeat_interleave(group, dim=1)  # noqa: E731
        dequantized[f"{name}.weight"] = (codes.float() - expand(zeros)) * expand(scales)
    qcfg: dict[str, Any] = {"quant_method": fmt, "bits": bits, "group_size": group}
    qcfg.update({"desc_act": False, "sym": False, "checkpoint_format": "gptq"} if fmt == "gptq"
                else {"version": "gemm", "zero_point": True})
    _save(model, src, dst, state, qcfg)
    model.load_state_dict(dequantized)
    model.save_pretrained(dst / "dequantized")
    AutoTokenizer.from_pretrained(src).save_pretrained(dst / "dequantized")
    return dst


def with_kv_scales(src: Path, dst: Path, scales: dict[str, torch.Tensor]) -> Path:
    """A copy at `dst` of the sharded HF checkpoint `src` with `scales` (KV-cache scale tensors by their checkpoint
    names) added in a file of their own, `kv-scales.safetensors`, listed in the index (only listed files load, as
    in HF and vLLM). Returns `dst`."""
    import shutil

    shutil.copytree(src, dst)
    save_file(scales, str(dst / "kv-scales.safetensors"))
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"] |= dict.fromkeys(scales, "kv-scales.safetensors")
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst

"""Quantized test checkpoints of tiny HF models, written with the formats' own tools where they install.

- compressed-tensors: the `compressed-tensors` library computes each scheme's scales and zero points
  (`calculate_qparams`) and packs the weights with its own compressor, and decompresses them again for
  the oracle: HF transformers run on the decompressed (dequantized) weights.
- GPTQ and AWQ: their tools need CUDA, so `pack_gptq` / `pack_awq` write the published layouts from
  the same integer codes; tests check both packers against hand-computed words.
- Activation order (GPTQ desc_act, compressed-tensors actorder group): `int4_checkpoint(act_order=True)` quantizes
  each layer's inputs in groups of a random order (`input_orders`; GPTQ's comes from the calibration inputs) and
  stores each input's group (g_idx). The compressed-tensors library dropped actorder group (0.20 refuses it) and
  llm-compressor is not installed here, so `pack_compressed_tensors` writes its pack-quantized layout from the codes
  as `pack_gptq` does GPTQ's (tests/engine/test_act_order.py checks both against hand-computed words).
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


def pack_gptq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int = 4,
              g_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """GPTQ v1 tensors of one layer: qweight packed along inputs `[in * bits / 32, out]`, qzeros (zero - 1)
    packed along outputs `[groups, out * bits / 32]`, scales `[groups, out]`, g_idx (each input's group; `i //
    group` unless given: activation order)."""
    group = codes.shape[1] // scales.shape[1]
    return {
        "qweight": pack_codes(codes, bits).t().contiguous(),
        "qzeros": pack_codes((zeros - 1).t().contiguous() & (2**bits - 1), bits),
        "scales": scales.t().contiguous().half(),
        "g_idx": torch.arange(codes.shape[1], dtype=torch.int32) // group if g_idx is None else g_idx,
    }


def pack_compressed_tensors(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                            bits: int = 4) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized tensors of one asymmetric layer with actorder group: weight_packed packed
    along inputs `[out, in * bits / 32]`, weight_zero_point packed along outputs `[out * bits / 32, groups]` (both
    unsigned, the signed codes plus 2^(bits-1)), weight_scale `[out, groups]`, weight_g_idx, weight_shape."""
    return {
        "weight_packed": pack_codes(codes, bits),
        "weight_zero_point": pack_codes(zeros.t().contiguous(), bits).t().contiguous(),
        "weight_scale": scales.half(),
        "weight_g_idx": g_idx,
        "weight_shape": torch.tensor(codes.shape),
    }


def input_orders(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random activation order of each linear layer's inputs (by layer name), one per input the layers read: q/k/v
    share theirs, as gate/up do (GPTQ orders an input by its calibration statistics)."""
    generator = torch.Generator().manual_seed(seed)
    shared: dict[tuple[str, int], torch.Tensor] = {}
    orders = {}
    for name in _linear_names(model):
        width = model.get_submodule(name).in_features
        key = (name.rpartition(".")[0], width)  # e.g. model.layers.0.mlp: gate and up (down reads another width)
        orders[name] = shared.setdefault(key, torch.randperm(width, generator=generator))
    return orders


def act_order_codes(weight: torch.Tensor, order: torch.Tensor, group: int,
                    bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`int4_codes` in groups of inputs taken in `order`: (codes `[out, in]` in input order, scales and zeros `[out,
    groups]`, g_idx `[in]`), with `weight ~= (codes - zeros[:, g_idx]) * scales[:, g_idx]`."""
    sorted_codes, scales, zeros = int4_codes(weight[:, order], group, bits)
    codes = torch.empty_like(sorted_codes)
    codes[:, order] = sorted_codes
    g_idx = torch.empty(weight.shape[1], dtype=torch.int32)
    g_idx[order] = torch.arange(weight.shape[1], dtype=torch.int32) // group
    return codes, scales, zeros, g_idx


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


def int4_checkpoint(src: Path, dst: Path, fmt: str, group: int = 32, bits: int = 4, act_order: bool = False) -> Path:
    """`src` quantized to asymmetric int4 (gptq: also int8) in `fmt` (gptq or awq), plus `dst/dequantized` for HF.
    `act_order`: groups of inputs in a random order (`input_orders`) with g_idx, as GPTQ desc_act (fmt gptq) or
    compressed-tensors actorder group (fmt compressed-tensors, llm-compressor's asymmetric config) store them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    state = dict(model.state_dict())
    dequantized = dict(state)
    orders = input_orders(model)
    for name in _linear_names(model):
        weight = state.pop(f"{name}.weight")
        if act_order:
            codes, scales, zeros, g_idx = act_order_codes(weight, orders[name], group, bits)
        else:
            (codes, scales, zeros), g_idx = int4_codes(weight, group, bits), torch.arange(weight.shape[1]) // group
        scales = scales.half().float()  # the checkpoint stores fp16 scales
        if fmt == "gptq":
            packed = pack_gptq(codes, scales, zeros, bits, g_idx.to(torch.int32) if act_order else None)
        elif fmt == "compressed-tensors":
            packed = pack_compressed_tensors(codes, scales, zeros, g_idx.to(torch.int32), bits)
        else:
            packed = pack_awq(codes, scales, zeros)
        state.update({f"{name}.{k}": v for k, v in packed.items()})
        dequantized[f"{name}.weight"] = (codes.float() - zeros[:, g_idx].float()) * scales[:, g_idx]
    _save(model, src, dst, state, _int4_config(fmt, bits, group, act_order))
    model.load_state_dict(dequantized)
    model.save_pretrained(dst / "dequantized")
    AutoTokenizer.from_pretrained(src).save_pretrained(dst / "dequantized")
    return dst


def _int4_config(fmt: str, bits: int, group: int, act_order: bool) -> dict[str, Any]:
    """The quantization_config of an `int4_checkpoint`."""
    if fmt == "compressed-tensors":  # llm-compressor 0.14's asymmetric W4A16 (tests/engine/data), actorder group
        qcfg = json.loads((Path(__file__).parent / "data" / "llmcompressor-0.14-gptq-w4a16-asym-g64.json").read_text())
        weights = qcfg["config_groups"]["group_0"]["weights"]
        weights.update(num_bits=bits, group_size=group, actorder="group" if act_order else None)
        return qcfg
    qcfg: dict[str, Any] = {"quant_method": fmt, "bits": bits, "group_size": group}
    qcfg.update({"desc_act": act_order, "sym": False, "checkpoint_format": "gptq"} if fmt == "gptq"
                else {"version": "gemm", "zero_point": True})
    return qcfg


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

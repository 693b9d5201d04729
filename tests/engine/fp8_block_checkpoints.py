"""Block-scaled fp8 test checkpoints of tiny HF models, and HF's dense copy of what they hold.

- vLLM's own fp8 format (`weight_block_size`, Qwen3-*-FP8's layout): `quantize_fp8_blocks` rounds each
  `block_n x block_k` block to e4m3 with the scale `amax / 448` (as the DeepSeek/Qwen quantizers do), written as
  `weight` and `weight_scale_inv`.
- compressed-tensors FP8_BLOCK: the compressed-tensors library computes the block scales (`calculate_qparams`
  over each block's min/max) and compresses and decompresses the weights itself.
Either way `dst/dequantized` holds the dense checkpoint (fp8 x scale written back, fp32) for HF to run as the
oracle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flotilla.kernels.fp8_block_linear import block_scale_shape, dequantize_fp8_blocks
from flotilla.kernels.fp8_linear import FP8_DTYPE, FP8_MAX, FP8_MIN_SCALE

from .quant_checkpoints import _linear_names, _save


def _blocks(weight: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """`weight` zero-padded to whole blocks as `[N / block_n, block_n, K / block_k, block_k]`."""
    nb, kb = block_scale_shape(*weight.shape, block)
    padded = F.pad(weight.float(), (0, kb * block[1] - weight.shape[1], 0, nb * block[0] - weight.shape[0]))
    return padded.reshape(nb, block[0], kb, block[1])


def quantize_fp8_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` `[N, K]` -> (e4m3 values `[N, K]`, fp32 scales `[ceil(N / block_n), ceil(K / block_k)]`), each
    block's scale its absolute maximum over 448."""
    grid = _blocks(weight, block)
    scale = (grid.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    codes = (grid / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    n, k = weight.shape
    return codes.reshape(grid.shape[0] * block[0], -1)[:n, :k].contiguous(), scale


def fp8_block_checkpoint(src: Path, dst: Path, fmt: str = "fp8", block: tuple[int, int] = (128, 128)) -> Path:
    """`src` (an HF directory) with every decoder linear weight in `block` fp8 blocks, in `fmt` ("fp8": vLLM's
    format, "compressed-tensors": FP8_BLOCK), into `dst`, plus `dst/dequantized` for HF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    state = dict(model.state_dict())
    dequantized = dict(state)
    if fmt == "fp8":
        qcfg: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": list(block)}
        for name in _linear_names(model):
            codes, scale = quantize_fp8_blocks(state.pop(f"{name}.weight"), block)
            state |= {f"{name}.weight": codes, f"{name}.weight_scale_inv": scale}
            dequantized[f"{name}.weight"] = dequantize_fp8_blocks(codes, scale, block)
    else:
        qcfg = _compressed_tensors_blocks(model, state, dequantized, block)
    _save(model, src, dst, state, qcfg)
    model.load_state_dict(dequantized)
    model.save_pretrained(dst / "dequantized")
    AutoTokenizer.from_pretrained(src).save_pretrained(dst / "dequantized")
    return dst


def _compressed_tensors_blocks(model: torch.nn.Module, state: dict[str, torch.Tensor],
                               dequantized: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, Any]:
    """FP8_BLOCK through the compressed-tensors library (its preset with `block` as block_structure): `state` and
    `dequantized` updated in place; the quantization_config returned."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    scheme.weights = scheme.weights.model_copy(update={"block_structure": list(block)})
    compressor = BaseCompressor.load_from_registry("float-quantized")
    for name in _linear_names(model):
        weight = state.pop(f"{name}.weight")
        grid = _blocks(weight, block)
        scale, zero = calculate_qparams(grid.amin(dim=(1, 3)), grid.amax(dim=(1, 3)), scheme.weights)
        packed = compressor.compress({"weight": weight, "weight_scale": scale, "weight_zero_point": zero}, scheme)
        state.update({f"{name}.{k}": v for k, v in packed.items()})
        dequantized[f"{name}.weight"] = compressor.decompress(dict(packed), scheme)["weight"].float()
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized", ignore=["lm_head"])
    return config.model_dump(exclude_none=True)

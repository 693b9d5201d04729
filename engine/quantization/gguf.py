"""`--quantization gguf`: a GGUF file's linear weights served as the file stores them (vLLM's `quant_method: gguf`).

The model is a `.gguf` file (`flotilla serve model.gguf --tokenizer DIR`, as `vllm serve`), or, with no model, the
embedded SmolLM2-135M-Instruct's own Q4_1 GGUF (`engine/embedded_model.py`; its converted directory gives the
tokenizer). The file is read with the `gguf` package's `GGUFReader` (llama architecture; the names are llama.cpp's,
mapped to HF's below; llama.cpp's converter permutes the rows of Q and K for its rotary layout, undone here as
transformers undoes it).

Linear layers by the type of their GGUF tensors (every projection of a merged layer 4-bit, else the layer is dense:
a Q4_K_M file's qkv with a Q6_K `attn_v` runs dense, its all-Q4_K ones as codes):
- Q4_1 (blocks of 32 inputs: fp16 `d`, fp16 `m`, 16 bytes of nibbles, weight `d * q + m`), Q4_0 (fp16 `d`,
  16 bytes, weight `d * (q - 8)`) and Q4_K (super-blocks of 256 inputs, each sub-block of 32 `d * sc * q - dmin *
  m` with 6-bit `sc`, `m`: `gguf_blocks.py`): the 4-bit codes, one scale (`d`, or `d * sc`) and one offset (`m`,
  `-8 d`, or `-dmin * m`) per 32 inputs, in float32, which holds each exactly (an fp16 times an integer under 64)
  (`weight_packed` / `weight_scale` / `weight_offset`, output rows first). Byte `j` of a Q4_0/Q4_1 block holds
  input `j` in its low nibble and input `j + 16` in its high one (ggml's `block_q4_1`; tests check it against
  `gguf.quants.dequantize` on the shipped file). On the CPU in bf16 the layer runs torch's packed int4 kernel,
  whose weight is `(q - 8) * scale + bias` a group: scale `d`, bias `offset + 8 d` (`process_weights`), both
  rounded to bf16 (the kernel's scale dtype is the activations'); elsewhere (CUDA, fp32/fp16 models, whose int4
  path in torch is slower than a dense matmul) the weight is dequantized once at load in float32 arithmetic,
  dense in the model dtype: in fp32 exactly the file's values.
- Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K (and a Q4_K tensor of a dense layer): decoded by `gguf_blocks.py` into float32
  (exactly `gguf.quants.dequantize`'s values), then the model dtype, dense. Q8_0, F16, BF16, F32: dequantized by
  `gguf.quants.dequantize` into the model dtype, dense (torch's CPU int8 kernel takes one scale a row; Q8_0 has
  one per 32 inputs).
- Any other type (IQ*, TQ*, MXFP4, ...) is refused at load, naming the tensor.
Embeddings, norms and the LM head: dequantized into the model dtype, whatever the type (`dequantize_tensor`).
On the CPU in bf16 a Q8_0 LM head (the tied embedding when the file has no `output.weight`) also runs as its 8-bit
codes through torch's int4 kernel, as two exact 4-bit planes (`attach_gguf_lm_head`, `cpu_int8_blocks_weight`):
at one row the head is the step's largest weight (49,152 x 576 here, as many bytes in bf16 as all 30 layers'
4-bit linears), and a dense bf16 matmul reads it at 2-4x the time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flotilla.engine.quantization.gguf_blocks import DECODED_TYPES, dequantize_blocks, unpack_q4_k
from flotilla.engine.quantization.gguf_file import gguf_reader
from flotilla.engine.quantization.method import LinearMethod, in_features, out_features, replace_parameter
from flotilla.kernels.cpu_int_linear import (
    CpuIntWeight,
    cpu_int4_affine_weight,
    cpu_int8_blocks_weight,
    cpu_int_linear,
)
from flotilla.kernels.packed_int_linear import pack_codes, unpack_codes
from flotilla.kernels.switches import env_flag

BLOCK = 32  # inputs per Q4_0 / Q4_1 / Q8_0 block and per Q4_K sub-block: one scale and offset each
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
DENSE_TYPES = ("Q8_0", "F16", "BF16", "F32", *(t for t in DECODED_TYPES if t not in INT4_TYPES))
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_SKIPPED = ("rope_freqs.weight",)  # llama 3's rope scaling: the config carries it, as transformers does


def hf_name(gguf_name: str) -> str | None:
    """The HF (transformers Llama) name of a llama.cpp tensor name; None for one the engine does not load."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    if gguf_name in _SKIPPED:
        return None
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a llama model")
    return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}.{match.group(3)}"


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight")


def unpack_q4_blocks(raw: np.ndarray, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0 / Q4_1 tensor's bytes `[rows, cols / 32 * block bytes]` -> unsigned codes `[rows, cols]` (uint8),
    scales `d` and offsets `[rows, cols / 32]` (float32): the weight is `scale * code + offset` a block."""
    head = 4 if type_name == "Q4_1" else 2
    rows = raw.shape[0]
    blocks = torch.from_numpy(np.array(raw, dtype=np.uint8)).reshape(rows, -1, head + 16)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    offset = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() if head == 4 else -8.0 * d
    qs = blocks[..., head:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # byte j: input j (low nibble), input j + 16 (high)
    return codes.reshape(rows, -1), d, offset


def unpack_q8_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's bytes `[rows, cols / 32 * 34]` -> signed codes `[rows, cols]` (int8) and scales `d`
    `[rows, cols / 32]` (float32): the weight is `d * code` a block (ggml's `block_q8_0`: fp16 `d`, 32 int8)."""
    rows = raw.shape[0]
    blocks = torch.from_numpy(np.array(raw, dtype=np.uint8)).reshape(rows, -1, 2 + BLOCK)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    return blocks[..., 2:].contiguous().view(torch.int8).reshape(rows, -1), d


def unpack_int4_tensor(raw: np.ndarray, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0 / Q4_1 / Q4_K tensor -> codes `[rows, cols]` (uint8), scales and offsets `[rows, cols / 32]` (float32):
    the weight is `scale * code + offset` a block of 32."""
    return unpack_q4_k(raw) if type_name == "Q4_K" else unpack_q4_blocks(raw, type_name)


def dequantize_tensor(raw: np.ndarray, type_name: str) -> torch.Tensor:
    """Any GGUF tensor as float32 (rows first, as HF stores it): `gguf_blocks`' decoders for theirs, else gguf's own
    `dequantize`."""
    if type_name in DECODED_TYPES and raw.ndim == 2:
        return dequantize_blocks(raw, type_name)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType[type_name]), dtype=np.float32))


def _qk_row_order(name: str, rows: int, hf_config: dict[str, Any]) -> torch.Tensor | None:
    """llama.cpp stores Q and K rows permuted for its rotary layout; the row order that undoes it (transformers'
    `reverse_permute_weights`), or None for other tensors."""
    if ".q_proj." in name:
        heads = hf_config["num_attention_heads"]
    elif ".k_proj." in name:
        heads = hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"]
    else:
        return None
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def tensor_types(path: str | Path) -> dict[str, str]:
    """HF name -> GGUF type name of every tensor the engine loads from the file."""
    types = {}
    for tensor in gguf_reader(str(path)).tensors:
        name = hf_name(tensor.name)
        if name is not None:
            types[name] = tensor.tensor_type.name
    return types


def gguf_checkpoint_tensors(path: str | Path, hf_config: dict[str, Any],
                            int4_layers: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The file's tensors under HF names: for the linear weights in `int4_layers` (HF weight names), the 4-bit
    layout (`<layer>.weight_packed`, `.weight_scale`, `.weight_offset`); every other tensor dequantized
    (float32; the loader casts it to the model dtype). ValueError for a linear weight of a type not served."""
    for tensor in gguf_reader(str(path)).tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        kind = tensor.tensor_type.name
        raw = np.asarray(tensor.data)
        if _is_linear(name) and kind not in INT4_TYPES + DENSE_TYPES:
            raise ValueError(f"GGUF tensor {tensor.name} ({name}) is {kind}; --quantization gguf serves linear "
                             f"weights stored as {'/'.join(INT4_TYPES)} (4-bit codes) or {'/'.join(DENSE_TYPES)} "
                             "(dense); re-quantize the file to one of those (llama-quantize), or serve a "
                             "safetensors directory")
        order = _qk_row_order(name, raw.shape[0], hf_config)
        if name in int4_layers:
            codes, scale, offset = unpack_int4_tensor(raw, kind)
            if order is not None:
                codes, scale, offset = codes[order], scale[order], offset[order]
            prefix = name.removesuffix(".weight")
            yield f"{prefix}.weight_packed", pack_codes(codes, 4)
            yield f"{prefix}.weight_scale", scale.contiguous()
            yield f"{prefix}.weight_offset", offset.contiguous()
            continue
        weight = dequantize_tensor(raw, kind)
        yield name, weight if order is None else weight[order].contiguous()


def dequantize_affine(packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, dtype: torch.dtype
                      ) -> torch.Tensor:
    """The weight `[out, in]`: `scale * code + offset` a block of 32 (float32 arithmetic, then `dtype`)."""
    codes = unpack_codes(packed, 4).float()
    rows = codes.shape[0]
    weight = codes.reshape(rows, -1, BLOCK) * scale.float().unsqueeze(-1) + offset.float().unsqueeze(-1)
    return weight.reshape(rows, -1).to(dtype)


class GgufInt4Method(LinearMethod):
    """A linear layer whose GGUF tensors are Q4_0/Q4_1/Q4_K: 4-bit codes with a float scale and offset a block of
    32."""

    def create_weights(self, layer: Any) -> None:
        """Packed codes `[out, in / 8]` int32, scale and offset `[out, in / 32]` float32 in place of the weight."""
        rows, cols = out_features(layer), in_features(layer)
        if cols % BLOCK:
            raise ValueError(f"a layer of {cols} inputs does not split into GGUF blocks of {BLOCK}")
        layer.gguf_dtype = layer.weight.dtype
        del layer.weight
        replace_parameter(layer, "weight_packed", torch.empty(rows, cols // 8, dtype=torch.int32))
        replace_parameter(layer, "weight_scale", torch.empty(rows, cols // BLOCK, dtype=torch.float32))
        replace_parameter(layer, "weight_offset", torch.empty(rows, cols // BLOCK, dtype=torch.float32))

    def process_weights(self, layer: Any) -> None:
        """On the CPU in bf16: torch's int4 layout (scale `d`, bias `offset + 8 d`, both bf16); otherwise the dense
        weight, dequantized once (torch 2.13's int4 kernel with fp16/fp32 activations runs 25-130x slower than
        its bf16 path, and slower than a dense matmul: bench/cpu_int4_dtype.py)."""
        dtype = layer.gguf_dtype
        layer.cpu_int_weight = None
        layer.dense_weight = None
        if layer.weight_packed.device.type == "cpu" and dtype == torch.bfloat16:
            layer.cpu_int_weight = cpu_int4_affine_weight(unpack_codes(layer.weight_packed, 4), layer.weight_scale,
                                                          layer.weight_scale * 8 + layer.weight_offset, BLOCK, dtype)
        if layer.cpu_int_weight is None:
            layer.dense_weight = dequantize_affine(layer.weight_packed, layer.weight_scale, layer.weight_offset,
                                                   dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ W^T + bias` through torch's int4 kernel on the CPU, else the dense weight."""
        weight: CpuIntWeight | None = layer.cpu_int_weight
        if weight is not None and not x.is_cuda and x.dtype == weight.scales.dtype:
            return cpu_int_linear(x, weight, bias)
        if layer.dense_weight is None:
            layer.dense_weight = dequantize_affine(layer.weight_packed, layer.weight_scale, layer.weight_offset,
                                                   layer.gguf_dtype)
        from flotilla.kernels.dispatch import linear

        return linear(x, layer.dense_weight.to(x.dtype), bias, layer.gemv_max_rows)


def attach_gguf_methods(model: Any, path: str | Path, hf_config: dict[str, Any]) -> set[str]:
    """Before loading: `GgufInt4Method` on every linear layer whose GGUF tensors are all Q4_0/Q4_1/Q4_K (a merged
    layer's projections must all be; otherwise it stays dense). Returns the HF weight names loaded as codes."""
    from flotilla.engine.layers.linear import quantizable_layers
    from flotilla.engine.model_loader import packed_target

    types = tensor_types(path)
    sources: dict[str, list[str]] = {}
    for name in types:
        if _is_linear(name):
            target, _ = packed_target(model.checkpoint_name(name), model.packed_modules)
            sources.setdefault(target.removesuffix(".weight"), []).append(name)
    layers = {id(layer) for layer in quantizable_layers(model)}
    method = GgufInt4Method()
    int4: set[str] = set()
    for module_name, layer in model.named_modules():
        names = sources.get(module_name)
        if id(layer) in layers and names and all(types[n] in INT4_TYPES for n in names):
            layer.quant_method = method
            method.create_weights(layer)
            int4.update(names)
    return int4


def attach_gguf_lm_head(model: Any, path: str | Path) -> bool:
    """After loading, on the CPU in bf16 with one tensor-parallel rank: a Q8_0 LM head (the file's `output.weight`,
    else its tied `token_embd.weight`) as 8-bit codes in torch's int4 layout (`lm_head.cpu_int_weight`, which
    `ParallelLMHead` prefers); the dense weight stays for the embedding. True when attached."""
    from flotilla.engine.parallel_state import is_last_stage, tp_size

    if not is_last_stage():  # an earlier pipeline stage holds no LM head
        return False
    head = model.lm_head
    if not env_flag("FLOTILLA_GGUF_CPU_HEAD", True):  # the dense bf16 head (an A/B switch)
        return False
    if head.weight.device.type != "cpu" or head.weight.dtype != torch.bfloat16 or tp_size() != 1:
        return False
    tensors = {t.name: t for t in gguf_reader(str(path)).tensors}
    tensor = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if tensor is None or tensor.tensor_type.name != "Q8_0":
        return False
    codes, d = unpack_q8_blocks(np.asarray(tensor.data))
    if codes.shape != head.weight.shape:
        return False
    head.cpu_int_weight = cpu_int8_blocks_weight(codes, d, torch.bfloat16, BLOCK)
    return head.cpu_int_weight is not None

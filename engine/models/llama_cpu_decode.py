"""The Llama decoder's CPU decode step (one new token a sequence) as plain torch calls: the module path's values in
fewer ops and no module calls.

On the CPU a one-row decode step of the embedded model is ~1,650 small torch ops besides its 121 GEMMs and 30 SDPA
calls, a few microseconds each, plus ~11 module calls and the dispatch functions' branches a layer: together about
as long as the GEMMs (session 11's profile: int4 linears 6.8 ms, ~5-6 ms of small ops and Python). Here each layer
is one function over the weights gathered once (`cpu_decode_plan`), with the ops the module path runs under the
step memo (`dispatch.CPU_STEP_MEMO`) and nothing else: the RMSNorms with in-place fp32 steps (the same products
and sums), the QKV output viewed as heads once, q and k rotated in one pass (`cpu_rotary_kv`), K/V written with
`index_copy_`, the cache read as one strided view (`cpu_attention`), the same SDPA call. Every op rounds as the
module path's does, so the hidden states are bit-identical (tests/engine/test_llama_cpu_decode.py).

Taken only where the module path would take the memo's ops: CPU, bf16/fp16 activations, a cache of the activations'
dtype with scales 1, the step memo on, every row one token; a model whose layers are the plain Llama ones (no q/k
norm, no LoRA wrappers, one tensor-parallel rank and one pipeline stage) and whose linear layers are dense or carry
torch's CPU integer weights (`--quantization gguf`, the packed-int methods). FLOTILLA_CPU_DECODE_LAYERS=0: the
module path (an A/B switch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from flotilla.engine.forward_context import AttentionMetadata
from flotilla.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, _Linear
from flotilla.engine.parallel_state import pp_size, tp_size
from flotilla.engine.quantization.gguf import GgufInt4Method
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.engine.quantization.rtn import RtnMethod
from flotilla.kernels import dispatch
from flotilla.kernels.cpu_attention import decode_gather
from flotilla.kernels.cpu_int_linear import CpuIntWeight, cpu_int_linear
from flotilla.kernels.cpu_rotary_kv import cos_sin, rotate
from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.switches import env_flag

if TYPE_CHECKING:
    from flotilla.engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM

CPU_DECODE_LAYERS = env_flag("FLOTILLA_CPU_DECODE_LAYERS", True)

# quant methods whose CPU `apply` is `cpu_int_linear(x, layer.cpu_int_weight, bias)` for activations of the scales'
# dtype (exact types: a subclass may apply otherwise)
_CPU_INT_METHODS = (GgufInt4Method, PackedIntMethod, RtnMethod)


@dataclass
class CpuDecodeLayer:
    """What one decoder layer's decode step reads, gathered once."""

    module: LlamaDecoderLayer
    norm1: torch.Tensor
    eps1: float
    norm2: torch.Tensor
    eps2: float
    qkv: _Linear
    o: _Linear
    gate_up: _Linear
    down: _Linear
    heads: int
    kv_heads: int
    dim: int
    scale: float
    cos_sin_cache: torch.Tensor


def _linear_takes(layer: _Linear, cls: type, dtype: torch.dtype) -> bool:
    """Whether `_matmul` computes what `layer`'s forward does: the plain class, dense or a CPU integer weight of
    `dtype` through one of `_CPU_INT_METHODS`."""
    if type(layer) is not cls:
        return False
    method = layer.quant_method
    if method is None:
        return layer.weight.dtype == dtype and (layer.bias is None or layer.bias.dtype == dtype)
    weight = getattr(layer, "cpu_int_weight", None)
    return type(method) in _CPU_INT_METHODS and weight is not None and weight.scales.dtype == dtype


def _matmul(layer: _Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` on the CPU at tp 1: the integer kernel (bias added after it, as the quant methods and the
    row-parallel forward do) or the dense `F.linear`."""
    if layer.quant_method is not None:
        return cpu_int_linear(x, cast(CpuIntWeight, layer.cpu_int_weight), layer.bias)
    return F.linear(x, layer.weight, layer.bias)


def cpu_decode_plan(model: LlamaForCausalLM) -> list[CpuDecodeLayer] | None:
    """Each layer's weights for `cpu_decode_forward`, or None where the model is not one it computes exactly
    (see the module docstring)."""
    from flotilla.engine.layers.attention import Attention
    from flotilla.engine.layers.norm import RMSNorm
    from flotilla.engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP

    dtype = model.embed_tokens.weight.dtype
    if dtype not in (torch.bfloat16, torch.float16) or model.embed_tokens.weight.device.type != "cpu":
        return None
    if tp_size() != 1 or pp_size() != 1 or type(model.norm) is not RMSNorm or model.norm.weight.dtype != dtype:
        return None
    plans = []
    for layer in model.layers:
        if type(layer) is not LlamaDecoderLayer:
            return None
        attn, mlp = layer.self_attn, layer.mlp
        if type(attn) is not LlamaAttention or type(mlp) is not LlamaMLP or type(attn.attn) is not Attention:
            return None
        if attn.q_norm is not None or attn.rotary.cos_sin_cache.dtype != torch.float32:
            return None
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(type(n) is not RMSNorm or n.weight.dtype != dtype for n in norms):
            return None
        linears = ((attn.qkv_proj, QKVParallelLinear), (attn.o_proj, RowParallelLinear),
                   (mlp.gate_up_proj, MergedColumnParallelLinear), (mlp.down_proj, RowParallelLinear))
        if not all(_linear_takes(lin, cls, dtype) for lin, cls in linears):
            return None
        plans.append(CpuDecodeLayer(layer, norms[0].weight, norms[0].eps, norms[1].weight, norms[1].eps, attn.qkv_proj,
                            attn.o_proj, mlp.gate_up_proj, mlp.down_proj, attn.num_heads, attn.num_kv_heads,
                            attn.head_dim, attn.attn.scale, cast(torch.Tensor, attn.rotary.cos_sin_cache)))
    return plans


def cpu_decode_takes(plans: list[CpuDecodeLayer], hidden_dtype: torch.dtype, meta: AttentionMetadata) -> bool:
    """Whether this step runs `cpu_decode_forward`: a plan, the switches on, every row one token, caches of the
    activations' dtype with scales 1 (fp8 caches stay on the module path)."""
    if not (plans and CPU_DECODE_LAYERS and dispatch.CPU_STEP_MEMO and meta.max_query_len == 1):
        return False
    first = plans[0]
    if first.qkv is not first.module.self_attn.qkv_proj:  # projections wrapped (LoRA) after the plan was made
        return False
    attn = first.module.self_attn.attn
    return attn.k_cache.dtype == attn.v_cache.dtype == hidden_dtype and attn.k_scale == attn.v_scale == 1.0


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm_ref(x, weight, eps)[0]` for bf16/fp16 `x` and `weight`, its fp32 steps in place (the same
    roundings: `float()` copies, every product is commutative)."""
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    return h.mul_(var.add_(eps).rsqrt_()).to(x.dtype).mul_(weight)


def cpu_decode_forward(model: LlamaForCausalLM, plans: list[CpuDecodeLayer], hidden: torch.Tensor,
                       positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """The decoder layers and the final norm over the embedded tokens `hidden` `[B, hidden]`, as
    `LlamaForCausalLM.forward` computes them."""
    memo = meta.derived
    residual = hidden
    hidden = _rms_norm(hidden, plans[0].norm1, plans[0].eps1)
    for i, p in enumerate(plans):
        if i:
            residual = hidden.add_(residual)  # the MLP's fresh output: `hidden + residual` in place
            hidden = _rms_norm(residual, p.norm1, p.eps1)
        hidden = _attention(p, hidden, positions, meta, memo)
        residual = hidden.add_(residual)
        hidden = _rms_norm(residual, p.norm2, p.eps2)
        gate_up = _matmul(p.gate_up, hidden)
        gate, up = gate_up.chunk(2, dim=-1)
        hidden = _matmul(p.down, F.silu(gate).mul_(up))
    residual = hidden.add_(residual)
    return _rms_norm(residual, model.norm.weight, model.norm.eps)


def _attention(p: CpuDecodeLayer, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
               memo: dict) -> torch.Tensor:
    """QKV projection, rotary + KV write, one-token paged attention and the output projection: `[B, hidden]`."""
    batch = hidden.shape[0]
    heads, kv_heads, dim = p.heads, p.kv_heads, p.dim
    qkv = _matmul(p.qkv, hidden).view(batch, heads + 2 * kv_heads, dim)
    cos, signed_sin = cos_sin(memo, positions, p.cos_sin_cache, qkv.dtype)
    qk = rotate(qkv[:, : heads + kv_heads], cos, signed_sin)
    attn = p.module.self_attn.attn
    k_cache, v_cache = attn.k_cache, attn.v_cache
    if "cpu_slots" not in memo:
        memo["cpu_slots"] = meta.slot_mapping.long() if bool((meta.slot_mapping >= 0).all()) else None
    slots: torch.Tensor | None = memo["cpu_slots"]
    key, value = qk[:, heads:], qkv[:, heads + kv_heads :]
    if slots is None:  # padding slots in the step: the reference filters them
        write_kv_cache_ref(key, value, k_cache, v_cache, meta.slot_mapping)
    else:
        k_cache.view(-1, kv_heads, dim).index_copy_(0, slots, key)
        v_cache.view(-1, kv_heads, dim).index_copy_(0, slots, value)
    k, v, mask = decode_gather(k_cache, v_cache, meta.block_tables, meta.seq_lens, batch, memo)
    q = qk[:, :heads].view(batch, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.scale)
    return _matmul(p.o, out.view(batch, heads * dim))

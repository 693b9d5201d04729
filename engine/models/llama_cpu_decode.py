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
torch's CPU integer weights (`--quantization gguf`, the packed-int methods; not an activation-order layer, whose
input `apply` gathers). FLOTILLA_CPU_DECODE_LAYERS=0: the
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
from flotilla.kernels.cpu_rotary_kv import cos_sin, rotate, write_kv
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
    eps1: torch.Tensor  # the norms' eps and the hidden size as one-element fp32 tensors (`_rms_norm`)
    norm2: torch.Tensor
    eps2: torch.Tensor
    qkv: _Linear
    o: _Linear
    gate_up: _Linear
    down: _Linear
    heads: int
    kv_heads: int
    dim: int
    scale: float
    cos_sin_cache: torch.Tensor
    size: torch.Tensor
    # the K/V pools and their flat views (`_caches`)
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


@dataclass
class CpuDecodePlan:
    """The model's decode-step plan: its layers and the final norm's eps (a one-element fp32 tensor)."""

    layers: list[CpuDecodeLayer]
    final_eps: torch.Tensor


def _linear_takes(layer: _Linear, cls: type, dtype: torch.dtype) -> bool:
    """Whether `_matmul` computes what `layer`'s forward does: the plain class, dense or a CPU integer weight of
    `dtype` through one of `_CPU_INT_METHODS`."""
    if type(layer) is not cls:
        return False
    method = layer.quant_method
    if method is None:
        return layer.weight.dtype == dtype and (layer.bias is None or layer.bias.dtype == dtype)
    weight = getattr(layer, "cpu_int_weight", None)
    if getattr(layer, "weight_perm", None) is not None:  # activation order: `apply` gathers the input first
        return False
    return type(method) in _CPU_INT_METHODS and weight is not None and weight.scales.dtype == dtype


def _matmul(layer: _Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` on the CPU at tp 1: the integer kernel (bias added after it, as the quant methods and the
    row-parallel forward do) or the dense `F.linear`, which a row-parallel layer calls without its bias and adds
    it after (one rounding more than `F.linear`'s fused bias, so kept)."""
    bias = layer.bias
    if layer.quant_method is not None:
        return cpu_int_linear(x, cast(CpuIntWeight, layer.cpu_int_weight), bias)
    if bias is not None and type(layer) is RowParallelLinear:
        return F.linear(x, layer.weight) + bias
    return F.linear(x, layer.weight, bias)


def cpu_decode_plan(model: LlamaForCausalLM) -> CpuDecodePlan | None:
    """Each layer's weights for `cpu_decode_forward`, or None where the model is not one it computes exactly
    (see the module docstring)."""
    from flotilla.engine.layers.attention import Attention
    from flotilla.engine.layers.norm import RMSNorm
    from flotilla.engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP

    if tp_size() != 1 or pp_size() != 1:  # (a pipeline stage may not even hold the embedding or the norm)
        return None
    embedding = cast(torch.Tensor, model.embed_tokens.weight)  # one stage: the model's own embedding
    dtype = embedding.dtype
    if dtype not in (torch.bfloat16, torch.float16) or embedding.device.type != "cpu":
        return None
    if type(model.norm) is not RMSNorm or model.norm.weight.dtype != dtype:
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
        plans.append(CpuDecodeLayer(layer, norms[0].weight, _scalar(norms[0].eps), norms[1].weight,
                                    _scalar(norms[1].eps), attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                    mlp.down_proj, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.attn.scale,
                                    cast(torch.Tensor, attn.rotary.cos_sin_cache),
                                    _scalar(norms[0].weight.shape[0])))
    return CpuDecodePlan(plans, _scalar(model.norm.eps)) if plans else None


def cpu_decode_takes(plan: CpuDecodePlan, hidden_dtype: torch.dtype, meta: AttentionMetadata) -> bool:
    """Whether this step runs `cpu_decode_forward`: a plan, the switches on, every row one token, caches of the
    activations' dtype with scales 1 (fp8 caches stay on the module path)."""
    if not (CPU_DECODE_LAYERS and dispatch.CPU_STEP_MEMO and meta.max_query_len == 1):
        return False
    first = plan.layers[0]
    if first.qkv is not first.module.self_attn.qkv_proj:  # projections wrapped (LoRA) after the plan was made
        return False
    attn = first.module.self_attn.attn
    return attn.k_cache.dtype == attn.v_cache.dtype == hidden_dtype and attn.k_scale == attn.v_scale == 1.0


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """`rms_norm_ref(x, weight, eps)[0]` for bf16/fp16 `x` and `weight` (`eps` and the row size as one-element fp32
    tensors) in fewer ops: the mean of squares is torch's `sum` then a division by the size (what `mean` runs),
    and `eps + sum / size` is one `addcdiv` (one exact multiply by 1, the same quotient and sum); the fp32 steps run
    in place (`float()` copies; every product is commutative): the same roundings."""
    h = x.float()
    inv = torch.addcdiv(eps, h.pow(2).sum(-1, keepdim=True), size).rsqrt_()
    return h.mul_(inv).to(x.dtype).mul_(weight)


def cpu_decode_forward(model: LlamaForCausalLM, plan: CpuDecodePlan, hidden: torch.Tensor,
                       positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """The decoder layers and the final norm over the embedded tokens `hidden` `[B, hidden]`, as
    `LlamaForCausalLM.forward` computes them."""
    memo = meta.derived
    plans = plan.layers
    first = plans[0]
    # what every layer reads alike, once a step (the module path keeps the same values in the step's memo)
    rotation = cos_sin(memo, positions, first.cos_sin_cache, hidden.dtype)
    step = _Step(meta, memo, rotation, positions)
    residual = hidden
    hidden = _rms_norm(hidden, first.norm1, first.eps1, first.size)
    for i, p in enumerate(plans):
        if i:
            residual = hidden.add_(residual)  # the MLP's fresh output: `hidden + residual` in place
            hidden = _rms_norm(residual, p.norm1, p.eps1, p.size)
        hidden = _attention(p, hidden, step, first)
        residual = hidden.add_(residual)
        hidden = _rms_norm(residual, p.norm2, p.eps2, p.size)
        gate_up = _matmul(p.gate_up, hidden)
        gate, up = gate_up.chunk(2, dim=-1)
        hidden = _matmul(p.down, F.silu(gate).mul_(up))
    residual = hidden.add_(residual)
    return _rms_norm(residual, cast(torch.Tensor, model.norm.weight), plan.final_eps, first.size)


@dataclass
class _Step:
    """A decode step's shared inputs."""

    meta: AttentionMetadata
    memo: dict
    rotation: tuple[torch.Tensor, torch.Tensor]  # the first layer's cos and sign-folded sin (`cos_sin`)
    positions: torch.Tensor


def _attention(p: CpuDecodeLayer, hidden: torch.Tensor, step: _Step, first: CpuDecodeLayer) -> torch.Tensor:
    """QKV projection, rotary + KV write, one-token paged attention and the output projection: `[B, hidden]`."""
    batch = hidden.shape[0]
    heads, kv_heads, dim = p.heads, p.kv_heads, p.dim
    qkv = _matmul(p.qkv, hidden).view(batch, heads + 2 * kv_heads, dim)
    rotation = step.rotation if p.cos_sin_cache is first.cos_sin_cache else cos_sin(
        step.memo, step.positions, p.cos_sin_cache, qkv.dtype)
    qk = rotate(qkv[:, : heads + kv_heads], *rotation)  # q and k rotated in one pass, `[B, H + Hkv, D]`
    k_cache, v_cache, k_flat, v_flat = _caches(p)
    key, value = qk[:, heads:], qkv[:, heads + kv_heads :]
    write_kv(key, value, k_cache, v_cache, step.meta.slot_mapping, step.memo, (k_flat, v_flat))
    k, v, mask = decode_gather(k_cache, v_cache, step.meta.block_tables, step.meta.seq_lens, batch, step.memo)
    # q's heads grouped by KV head: `qk[:, :heads].view(batch, kv_heads, group, dim)` in one op
    group = heads // kv_heads
    q = qk.as_strided((batch, kv_heads, group, dim), (qk.stride(0), group * dim, dim, 1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.scale)
    return _matmul(p.o, out.view(batch, heads * dim))


def _caches(p: CpuDecodeLayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's K and V pools and their `[slots, Hkv, D]` views, made again only when the runner rebinds the
    pools."""
    attn = p.module.self_attn.attn
    found = p.caches
    if found is None or found[0] is not attn.k_cache or found[1] is not attn.v_cache:
        k, v = attn.k_cache, attn.v_cache
        found = p.caches = (k, v, k.view(-1, p.kv_heads, p.dim), v.view(-1, p.kv_heads, p.dim))
    return found


def _scalar(value: float) -> torch.Tensor:
    """A one-element fp32 tensor (`_rms_norm`'s eps and size)."""
    return torch.tensor([value], dtype=torch.float32)

"""The Llama family as one decoder: Llama 2/3, Mistral, Qwen2/2.5 (QKV bias) and Qwen3 (q/k norm), and their
mixture-of-experts forms: Mixtral, Qwen2-MoE and Qwen3-MoE (`engine/layers/moe.py` in place of a layer's MLP).

Read top to bottom: an embedding, N decoder layers (attention then gated MLP or MoE block, each behind an RMSNorm
fused with the residual add), a final norm and the LM head. Attention metadata comes from the forward
context, so every module keeps a plain `forward(positions, hidden)` signature.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import torch
from torch import nn

from flotilla.engine.forward_context import current_attention_metadata
from flotilla.engine.layers.activation import SiluAndMul
from flotilla.engine.layers.attention import Attention
from flotilla.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from flotilla.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from flotilla.engine.layers.moe import MoeArch, SparseMoeBlock
from flotilla.engine.layers.norm import RMSNorm
from flotilla.engine.layers.rotary import RotaryEmbedding
from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.models.llama_cpu_decode import (
    CpuDecodePlan,
    cpu_decode_forward,
    cpu_decode_plan,
    cpu_decode_takes,
)
from flotilla.engine.models.registry import activation_problem
from flotilla.engine.parallel_state import (
    is_last_stage,
    pp_rank,
    recv_from_prev_stage,
    send_to_next_stage,
    stage_layers,
    tp_size,
)
from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod, Fp8OnlineMethod
from flotilla.engine.quantization.packed_int import int4_weight
from flotilla.engine_rules import rope_positions
from flotilla.kernels.dispatch import (
    fp8_gated_gemv,
    fp8_gated_gemv_takes,
    fp8_qkv_rope_takes,
    int4_gated_gemv,
    int4_gated_gemv_takes,
    int4_qkv_rope_takes,
    qkv_rope_takes,
    silu_and_mul_linear,
)

# fp8 methods whose `apply` at one row is the W8A16 product of `weight` and `weight_scale` alone, which the fused
# one-row fp8 forms below compute themselves (exact types: fbgemm_fp8's subclass clips the activations first).
_FP8_ROW_METHODS = (Fp8OnlineMethod, Fp8CheckpointMethod)


@dataclass(frozen=True)
class LlamaArch:
    """The architecture numbers and variant switches the decoder needs, read from config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    moe: MoeArch | None = None  # a mixture-of-experts model's numbers (its sparse layers' MLP is a MoE block)

    @classmethod
    def from_hf(cls, c: dict[str, Any], *, qkv_bias: bool | None = None, qk_norm: bool = False) -> LlamaArch:
        """Read config.json; `rope_parameters` (transformers 5) and `rope_theta`/`rope_scaling` both work."""
        rope = dict(c.get("rope_parameters") or {})
        scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if problem := activation_problem(c):
            raise ValueError(problem)
        if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
            # transformers' defaults: the pretraining length is max_position_embeddings (a top-level
            # original_max_position_embeddings first), the factor their ratio
            scaling = dict(scaling)
            if c.get("original_max_position_embeddings"):
                scaling["original_max_position_embeddings"] = c["original_max_position_embeddings"]
            max_position = c.get("max_position_embeddings", 2048)
            scaling.setdefault("original_max_position_embeddings", max_position)
            if scaling.get("factor") is None:
                scaling["factor"] = max_position / scaling["original_max_position_embeddings"]
        num_heads = c["num_attention_heads"]
        attention_bias = bool(c.get("attention_bias", False))
        return cls(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=c.get("num_key_value_heads") or num_heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // num_heads,
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=scaling,
            # the rotary table covers the scaled length too (YaRN: original length x factor, as vLLM allows)
            max_position=rope_positions(c),
            qkv_bias=attention_bias if qkv_bias is None else qkv_bias,
            o_bias=attention_bias if qkv_bias is None else False,
            mlp_bias=bool(c.get("mlp_bias", False)),
            qk_norm=qk_norm,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        )


class LlamaAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k RMSNorm, rotary + paged attention, output projection."""

    def __init__(self, a: LlamaArch) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(a.hidden_size, a.head_dim, a.num_heads, a.num_kv_heads, a.qkv_bias)
        self.o_proj = RowParallelLinear(a.num_heads * a.head_dim, a.hidden_size, a.o_bias)
        self.num_heads = self.qkv_proj.num_heads  # this rank's heads (KV heads may be replicated)
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = a.head_dim
        self.q_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None
        self.k_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None
        self.rotary = RotaryEmbedding(a.head_dim, a.max_position, a.rope_theta, a.rope_scaling)
        self.attn = Attention(self.num_heads, self.num_kv_heads, a.head_dim, a.head_dim**-0.5)

    def _rope_fused(self, hidden: torch.Tensor) -> bool:
        """One row, plain weights (not quantized, not LoRA-wrapped), no q/k norm: the GEMV rotates and writes the KV
        cache in its epilogue (FLOTILLA_QKV_ROPE, kernels/dispatch.py). Not while a hook watches
        `Attention.forward`'s k/v (--calculate-kv-scales' calibration forward): that path never calls it."""
        qkv = self.qkv_proj
        return (self.q_norm is None and type(qkv) is QKVParallelLinear and qkv.quant_method is None and tp_size() == 1
                and not self.attn._forward_pre_hooks
                and qkv_rope_takes(hidden, qkv.weight, self.head_dim, qkv.gemv_max_rows))  # fmt: skip

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """`[T, hidden]` -> `[T, hidden]`."""
        qkv = self.qkv_proj
        if self._rope_fused(hidden):
            cos_sin = cast(torch.Tensor, self.rotary.cos_sin_cache)
            return self.o_proj(self.attn.forward_projected(hidden, qkv.weight, qkv.bias, positions, cos_sin))
        scale = getattr(qkv, "weight_scale", None)
        if (self.q_norm is None and type(qkv) is QKVParallelLinear and type(qkv.quant_method) in _FP8_ROW_METHODS
                and isinstance(scale, torch.Tensor) and tp_size() == 1 and not self.attn._forward_pre_hooks
                and fp8_qkv_rope_takes(hidden, qkv.weight, scale, qkv.bias, self.head_dim)):  # fmt: skip
            # the same with fp8 weights (W8A16 at one row; FLOTILLA_FP8_ROW_GEMV and FLOTILLA_QKV_ROPE)
            cos_sin = cast(torch.Tensor, self.rotary.cos_sin_cache)
            return self.o_proj(self.attn.forward_projected(hidden, qkv.weight, qkv.bias, positions, cos_sin, scale))
        int4 = int4_weight(qkv) if type(qkv) is QKVParallelLinear else None
        if (int4 is not None and self.q_norm is None and tp_size() == 1 and not self.attn._forward_pre_hooks
                and int4_qkv_rope_takes(hidden, int4, qkv.bias, self.head_dim)):  # fmt: skip
            # the same with int4 weights (the wide W4A16 GEMV at one row; FLOTILLA_INT4_QKV_ROPE)
            cos_sin = cast(torch.Tensor, self.rotary.cos_sin_cache)
            return self.o_proj(self.attn.forward_projected(hidden, int4, qkv.bias, positions, cos_sin))
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # Rotary is applied inside attention, fused with the KV-cache write.
        return self.o_proj(self.attn(q, k, v, positions, self.rotary.cos_sin_cache))


class LlamaMLP(nn.Module):
    """Gated MLP: merged gate/up projection, SiLU-and-mul, down projection."""

    def __init__(self, a: LlamaArch) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(a.hidden_size, [a.intermediate_size] * 2, a.mlp_bias)
        self.act = SiluAndMul()
        self.down_proj = RowParallelLinear(a.intermediate_size, a.hidden_size, a.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`[T, hidden]` -> `[T, hidden]`."""
        gate_up = self.gate_up_proj
        if type(gate_up) is MergedColumnParallelLinear and gate_up.quant_method is None:
            # plain weights (not quantized, not LoRA-wrapped): the GEMM may apply the activation itself
            return self.down_proj(silu_and_mul_linear(x, gate_up.weight, gate_up.bias, gate_up.gemv_max_rows))
        scale = getattr(gate_up, "weight_scale", None)
        if (type(gate_up) is MergedColumnParallelLinear and type(gate_up.quant_method) in _FP8_ROW_METHODS
                and isinstance(scale, torch.Tensor)
                and fp8_gated_gemv_takes(x, gate_up.weight, scale, gate_up.bias)):  # fmt: skip
            # fp8 weights (W8A16 at one row; every fp8 scheme but fbgemm_fp8, `_FP8_ROW_METHODS`): gate/up and
            # SiLU-and-mul in one launch (FLOTILLA_FP8_ROW_GEMV, kernels/dispatch.py)
            return self.down_proj(fp8_gated_gemv(x, gate_up.weight, scale, gate_up.bias))
        int4 = int4_weight(gate_up) if type(gate_up) is MergedColumnParallelLinear else None
        if int4 is not None and int4_gated_gemv_takes(x, int4, gate_up.bias):
            # int4 weights (the wide W4A16 GEMV at one row): gate/up and SiLU-and-mul in one launch
            # (FLOTILLA_INT4_GATED)
            return self.down_proj(int4_gated_gemv(x, int4, gate_up.bias))
        return self.down_proj(self.act(gate_up(x)))


def feed_forward(a: LlamaArch, layer: int) -> nn.Module:
    """Layer `layer`'s MLP: the gated MLP, or a MoE model's sparse block (with Qwen2-MoE's shared expert, a gated
    MLP of its own width)."""
    if a.moe is None or not a.moe.is_sparse(layer):
        return LlamaMLP(a)
    width = a.moe.shared_expert_intermediate_size
    shared = LlamaMLP(replace(a, intermediate_size=width, mlp_bias=False)) if width else None
    return SparseMoeBlock(a.hidden_size, a.moe, shared)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP; the residual stream is carried beside the hidden states."""

    def __init__(self, a: LlamaArch, layer: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = LlamaAttention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = feed_forward(a, layer)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the layer's output and the residual stream, not yet added together."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(CausalLM):
    """The whole model: token ids and positions in, last hidden states out; `compute_logits` for the head."""

    packed_modules: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, arch: LlamaArch) -> None:
        super().__init__()
        self.arch = arch
        # the model dtype (the loader sets torch's default for the construction): what a later stage receives
        self.dtype = torch.get_default_dtype()
        # A pipeline stage builds only what it runs, as vLLM does; what another stage holds is an empty placeholder
        # (nn.Identity, no parameters): its own layers; the embedding on the first stage (and on the last with tied
        # embeddings, where it is the LM head's weight); the final norm and the LM head on the last.
        self.first_stage, self.last_stage = pp_rank() == 0, is_last_stage()
        self.holds_embedding = self.first_stage or (self.last_stage and arch.tie_word_embeddings)
        self.embed_tokens: nn.Module = (VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
                                        if self.holds_embedding else nn.Identity())
        self.stage = stage_layers(arch.num_layers)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, i) if i in self.stage else nn.Identity() for i in range(arch.num_layers)
        )
        self.norm: nn.Module = RMSNorm(arch.hidden_size, arch.rms_norm_eps) if self.last_stage else nn.Identity()
        self.lm_head: nn.Module = (ParallelLMHead(arch.vocab_size, arch.hidden_size) if self.last_stage
                                   else nn.Identity())
        if arch.tie_word_embeddings and self.last_stage:
            self.lm_head.weight = self.embed_tokens.weight
        # the CPU decode step's weights (`llama_cpu_decode.py`), gathered at the first CPU forward, after loading
        # (None: the model is not one it computes exactly)
        self._cpu_plan: CpuDecodePlan | None = None
        self._cpu_planned = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`[T]` token ids at `[T]` positions -> final hidden states `[T, hidden]`."""
        residual: torch.Tensor | None = None
        if not input_ids.is_cuda:
            # the CPU decode step as plain calls where it computes the same (`llama_cpu_decode.py`)
            if not self._cpu_planned:
                self._cpu_plan, self._cpu_planned = cpu_decode_plan(self), True
            meta, plans = current_attention_metadata(), self._cpu_plan
            if plans is not None and meta is not None and cpu_decode_takes(plans, self.dtype, meta):
                return cpu_decode_forward(self, plans, self.embed_tokens(input_ids), positions, meta)
        if self.first_stage:
            hidden = self.embed_tokens(input_ids)
        else:  # a later pipeline stage starts from the previous stage's hidden states and residual
            shape = (input_ids.shape[0], self.arch.hidden_size)
            hidden, residual = recv_from_prev_stage([shape, shape], self.dtype, input_ids.device)
        for i in self.stage:
            hidden, residual = self.layers[i](positions, hidden, residual)
        assert residual is not None, "every stage holds at least one layer"
        if not self.last_stage:
            send_to_next_stage([hidden, residual])
            return hidden
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits for the selected hidden states (the last pipeline stage's: it alone holds the head)."""
        if not self.last_stage:
            raise RuntimeError("compute_logits on an earlier pipeline stage: only the last holds the LM head")
        return self.lm_head(hidden)

    @property
    def ties_lm_head(self) -> bool:
        """True when config.json ties the LM head to the embedding."""
        return self.arch.tie_word_embeddings

    def holds(self, name: str) -> bool:
        """False for the parameters another pipeline stage holds: its layers, the embedding (first stage; the
        last too when tied), the final norm and the LM head (last stage)."""
        parts = name.split(".")
        if parts[0] == "layers":
            return int(parts[1]) in self.stage
        if parts[0] == "embed_tokens":
            return self.holds_embedding
        if parts[0] in ("norm", "lm_head"):
            return self.last_stage
        return True

    @staticmethod
    def checkpoint_name(hf_name: str) -> str:
        """Our parameter name for an HF checkpoint tensor name (`model.` prefix dropped; Mixtral's MoE block is
        `block_sparse_moe`, ours `mlp` as Qwen's)."""
        return hf_name.removeprefix("model.").replace(".block_sparse_moe.", ".mlp.")

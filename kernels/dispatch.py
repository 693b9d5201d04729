"""The one place where the CPU and GPU paths differ.

The engine calls these functions and nothing else of `flotilla.kernels`. Each picks the Triton kernel
when the tensors live on a CUDA device, and otherwise the PyTorch reference (the CPU path CI runs);
attention on the CPU takes a faster arrangement of the reference (`cpu_attention.py`).
The Triton modules are imported inside the CUDA branches, so the CPU path never imports Triton (nor
defines a kernel before a test has set TRITON_INTERPRET).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from flotilla.kernels.activation import silu_and_mul_ref
from flotilla.kernels.card_tables import DEFAULT, H200, device_card, for_card
from flotilla.kernels.cpu_attention import paged_attention_cpu
from flotilla.kernels.cpu_int_linear import CpuIntWeight, cpu_int_linear
from flotilla.kernels.cpu_rotary_kv import rotary_and_write_kv_cpu
from flotilla.kernels.fp8_block_linear import fp8_block_linear_ref
from flotilla.kernels.fp8_linear import fp8_linear_ref, fp8_weight_only_linear_ref
from flotilla.kernels.int8_linear import int8_matmul, int_mm_runs, quantize_int8_activations
from flotilla.kernels.launch_knobs import KnobSyntax
from flotilla.kernels.layernorm import rms_norm_ref
from flotilla.kernels.lora import lora_apply_ref, lora_stacked_expand_ref
from flotilla.kernels.moe import fused_experts_ref, topk_routing_ref
from flotilla.kernels.nf4_linear import nf4_linear_ref
from flotilla.kernels.packed_int_linear import PackedInt4, packed_int_linear_ref
from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref
from flotilla.kernels.switches import env_choice, env_flag, parse_choice

# CPU: what every layer of a step derives alike (cos/sin, slots, the decode gather's indices) made once a step and
# kept in its memo, and the rotary/KV write in fewer ops (`cpu_rotary_kv.py`); FLOTILLA_CPU_STEP_MEMO=0: the
# reference path, op for op (an A/B switch: the values are the same)
CPU_STEP_MEMO = env_flag("FLOTILLA_CPU_STEP_MEMO", True)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store new tokens' K/V at their slots in the block pool (an fp8 pool: divided by the scales)."""
    if key.is_cuda:
        from flotilla.kernels.triton_kv_write import write_kv_cache as write_kv_cache_triton

        write_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return
    write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


# A mixed step's attention as two launches (`mixed_attention.py`): the decode rows through the decode kernel, the
# prompts through the prefill kernel, instead of the prefill kernel for all (issue 19). On: measured on the H100
# (session 22, bench/results/gpu-2026-12-05-s22/call2/mixattn): a 16,320-token offline step's attention 33-35 ->
# 25-26 ms, the step 371-377 -> 365-369 ms busy; "0" restores the one launch.
MIXED_DECODE_SPLIT = env_flag("FLOTILLA_MIXED_DECODE_SPLIT", True)


def mixed_split_takes(is_cuda: bool, num_seqs: int, max_query_len: int | None, enabled: bool | None = None) -> bool:
    """Whether a step's attention runs as `mixed_split_attention`'s two launches: `enabled` (None: the switch, read
    here so that a test may set it on the module), on CUDA, a step the host knows (`max_query_len`) to hold a
    sequence of more than one new token, and more than one sequence (one alone is a prompt with no decode row
    beside it). A pure decode step takes the decode kernel alone."""
    if not (MIXED_DECODE_SPLIT if enabled is None else enabled) or not is_cuda:
        return False
    return max_query_len is not None and max_query_len > 1 and num_seqs > 1


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    step_memo: dict | None = None,
) -> torch.Tensor:
    """Causal paged attention for a flattened batch (see `paged_attention.py` for the layout).

    An fp8 cache's scales are folded in: K's into the softmax scale, V's into the output.

    `max_query_len` is the caller's host-side knowledge of the longest new-token run in the batch.
    On CUDA, `1` (a pure decode step) selects the split-KV decode kernel; anything else, or `None`,
    the general prefill/extend kernel, which is correct for every batch, decode included (with
    FLOTILLA_MIXED_DECODE_SPLIT, a mixed step's decode rows go to the decode kernel: `mixed_split_takes`). The hint
    exists because deriving it from `query_start_loc` would sync with the host. `step_memo`: the
    step's `AttentionMetadata.derived`, where values every layer would derive alike are kept.
    """
    if query.is_cuda and max_query_len == 1:
        from flotilla.kernels.pdl import pdl_active
        from flotilla.kernels.triton_paged_decode import paged_decode_attention

        # the decode kernel scales its output itself (no extra elementwise kernel per layer); with FLOTILLA_PDL
        # its split merge is launched by PDL too, so that o_proj's GEMV starts while the attention runs
        return paged_decode_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                                      scale * k_scale, v_scale=v_scale,
                                      pdl_merge=pdl_active(query) or None)  # fmt: skip
    if mixed_split_takes(query.is_cuda, seq_lens.shape[0], max_query_len):
        from flotilla.kernels.mixed_attention import mixed_split_attention

        return mixed_split_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale * k_scale,
                                     v_scale, step_memo)  # fmt: skip
    out = _paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale * k_scale,
                           max_query_len, step_memo)
    return out if v_scale == 1.0 else out * v_scale


def _paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None,
    step_memo: dict | None = None,
) -> torch.Tensor:
    if query.is_cuda:
        from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

        return paged_prefill_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                       step_memo=step_memo)
    return paged_attention_cpu(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_query_len,
                               step_memo if CPU_STEP_MEMO else None)


def rotary_and_write_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    step_memo: dict | None = None,
) -> torch.Tensor:
    """Rotate query and key by position and store the rotated key and the value at their slots;
    returns the rotated query. One fused kernel on CUDA; on the CPU, given the step's memo, the same values in
    fewer torch ops (`cpu_rotary_kv.py`) for a cache of the activations' dtype."""
    if query.is_cuda:
        from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv as fused

        return fused(positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if (CPU_STEP_MEMO and step_memo is not None and k_cache.dtype == query.dtype == v_cache.dtype
            and k_scale == 1.0 and v_scale == 1.0):
        return rotary_and_write_kv_cpu(positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                       step_memo)
    query, key = apply_rotary_ref(positions, query, key, cos_sin_cache)
    write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return query


# One-row decode: the qkv GEMV with rotary and the K/V cache write in its epilogue (`triton_gemv_rope.py`: one
# launch a layer instead of the GEMV + `rotary_and_write_kv`; q and the cache rows bit-equal to the pair's).
# FLOTILLA_QKV_ROPE (read at import; the module global at every call): "1" (default: measured on the H200, bf16
# bs1 ctx512 4.490 -> 4.447 ms/step, greedy tokens identical; docs/decode-gemm.md) the fused kernel where
# `qkv_rope_takes`; "0" the pair.
QKV_ROPE = env_flag("FLOTILLA_QKV_ROPE", True)


def qkv_rope_takes(x: torch.Tensor, weight: torch.Tensor, head_dim: int, gemv_max_rows: int) -> bool:
    """Whether `qkv_rotary_and_write_kv` takes a plain (unquantized) qkv projection of `x`: switched on, CUDA, one
    row that `linear` would give the Triton GEMV, and a GEMV configuration the epilogue fits (`fuses_rope`)."""
    if not (QKV_ROPE and x.is_cuda and x.dim() == 2 and x.shape[0] == 1 <= gemv_max_rows
            and weight.shape[0] <= TRITON_GEMV_MAX_OUT):  # fmt: skip
        return False
    from flotilla.kernels.triton_gemv_rope import fuses_rope

    return fuses_rope(x, weight, head_dim)


def qkv_rotary_and_write_kv(
    x: torch.Tensor,
    weight: torch.Tensor | PackedInt4,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    weight_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`rotary_and_write_kv` of `linear(x, weight, bias)`'s q/k/v heads in one launch (where `qkv_rope_takes`):
    returns the rotated query `[1, H, D]`, the rotated key and the value stored at their slot. With `weight_scale`
    the weight is fp8 (W8A16, where `fp8_qkv_rope_takes`): the one-row fp8 GEMV's rope form; a `PackedInt4` weight
    (W4A16, where `int4_qkv_rope_takes`): the wide int4 GEMV's."""
    if isinstance(weight, PackedInt4):
        from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_rope

        return int4_gemv_wide_rope(x, *weight, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                   num_heads, num_kv_heads, k_scale, v_scale)  # fmt: skip
    if weight_scale is not None:
        from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_rope

        return fp8_row_gemv_rope(x, weight, weight_scale, bias, positions, cos_sin_cache, k_cache, v_cache,
                                 slot_mapping, num_heads, num_kv_heads, k_scale, v_scale)  # fmt: skip
    from flotilla.kernels.triton_gemv_rope import gemv_rope

    return gemv_rope(x, weight, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads,
                     num_kv_heads, k_scale, v_scale)  # fmt: skip


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm, fused with the residual add when `residual` is given."""
    if x.is_cuda:
        from flotilla.kernels.triton_rmsnorm import rms_norm as rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    if CPU_STEP_MEMO and residual is not None and residual.dtype == x.dtype:
        # one add in the activations' dtype rounds the fp32 sum once, as the reference's upcast-add-cast does
        # (3 ops fewer a norm, twice a layer)
        x = x + residual
        return rms_norm_ref(x, weight, eps)[0], x
    return rms_norm_ref(x, weight, eps, residual)


def apply_rotary(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of query and key by token position."""
    if query.is_cuda:
        from flotilla.kernels.triton_rotary import apply_rotary as apply_rotary_triton

        return apply_rotary_triton(positions, query, key, cos_sin_cache)
    return apply_rotary_ref(positions, query, key, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU-gated MLP activation on the merged gate/up projection."""
    if x.is_cuda:
        from flotilla.kernels.triton_activation import silu_and_mul as silu_and_mul_triton

        return silu_and_mul_triton(x)
    return silu_and_mul_ref(x)


def moe_routing(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's `top_k` experts and their fp32 weights (softmax, top-k, optionally renormalised): `[T, top_k]`
    weights and expert ids. The reference on every device (a handful of small ops)."""
    return topk_routing_ref(router_logits, top_k, renormalize)


# CUDA: the Triton grouped GEMMs (`triton_fused_moe.py`, tested against the reference under the interpreter and on
# an H100) in place of the reference's per-expert loop: Qwen3-30B-A3B's shape, eager, batch 1 / 16 at context 512,
# 107.3 / 430.0 -> 63.9 / 57.6 ms a step (session 33, bench/results/gpu-2026-12-07-s33/call4/). FLOTILLA_FUSED_MOE=0
# keeps the reference on CUDA.
FUSED_MOE = env_flag("FLOTILLA_FUSED_MOE", True)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts' gated MLPs summed per token (`kernels/moe.py`): `x` `[T, H]`, stacked `w13` `[E, 2I, H]`
    and `w2` `[E, H, I]` (fp8 ones with their per-row scales: W8A16). The PyTorch reference unless FUSED_MOE on
    CUDA: its per-expert loop reads the expert counts on the host, so a CUDA graph cannot hold it (the engine runs
    MoE models eagerly)."""
    if x.is_cuda and FUSED_MOE:
        from flotilla.kernels.triton_fused_moe import fused_experts as fused_experts_triton

        return fused_experts_triton(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    return fused_experts_ref(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's highest logit (lowest index on ties), as `logits.argmax(dim=-1)`."""
    if logits.is_cuda:
        from flotilla.kernels.triton_argmax import argmax_rows

        return argmax_rows(logits)
    if logits.dtype in (torch.bfloat16, torch.float16):
        # the same values exactly in fp32 (and the same first index on ties), argmaxed in a quarter of the time:
        # torch's CPU argmax of bf16 logits took 180 us a row of 49,152, the upcast and fp32 argmax 53
        return logits.float().argmax(dim=-1)
    return logits.argmax(dim=-1)


# Decode-time linear layers of at most `gemv_max_rows` rows (the engine's --triton-gemv-max-rows,
# default 1) and at most TRITON_GEMV_MAX_OUT output features use the Triton GEMV instead of cuBLAS.
# On the H200 at one row (bench/kernels.py gemv section), cuBLAS streams Llama-3.1-8B's qkv / o_proj /
# down weights at 76 / 59 / 86 % of copy bandwidth, the last two with a split-K reduce kernel each,
# and the GEMV at 77 / 68 / 85 % with no second kernel (inside a CUDA graph every kernel boundary
# costs time too). On gate_up (28,672 outputs) cuBLAS is ahead (98 % vs 93 %), and at four rows it is
# ahead everywhere.
TRITON_GEMV_MAX_OUT = 8192


# Decode batches of SKINNY_GEMM_MIN_ROWS..SKINNY_GEMM_MAX_ROWS rows (bf16/fp16 weights) take the Triton
# skinny GEMM (`triton_skinny_gemm.py`: swap-AB tiles, TMA or cp.async loads, split-K summed in the kernel)
# instead of cuBLAS, and the merged gate/up projection of a SiLU MLP its gated epilogue
# (`silu_and_mul_linear`: no SiLU kernel, no [M, 2I] intermediate). FLOTILLA_SKINNY_GEMM: "table" (the
# default) only for shapes the H200 sweep measured faster than cuBLAS (`MEASURED_CONFIGS`, Llama-3.1-8B's
# projections; H200 call 4 of the seventh session: decode batch 64 x ctx 512 5.928 -> 5.648 ms, batch 1
# unchanged); "1" every supported shape (unmeasured ones at `default_config`); "0" cuBLAS as before.
SKINNY_GEMM_MODE = env_choice("FLOTILLA_SKINNY_GEMM", {"table": "table", "1": "all", "0": "off"}, "table")
SKINNY_GEMM_MIN_ROWS = 17
SKINNY_GEMM_MAX_ROWS = 128


def _skinny_gemm_takes(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Whether the skinny GEMM runs `x @ weight.T` (CUDA, switched on, a decode-sized batch, its shapes)."""
    if not (SKINNY_GEMM_MODE != "off" and x.is_cuda and x.dim() == 2
            and SKINNY_GEMM_MIN_ROWS <= x.shape[0] <= SKINNY_GEMM_MAX_ROWS):  # fmt: skip
        return False
    from flotilla.kernels.triton_skinny_gemm import cublas_preferred, measured, supported

    m, n_rows, k, card = x.shape[0], weight.shape[0], x.shape[1], device_card(x)
    if not supported(x, weight, gated) or cublas_preferred(m, n_rows, k, gated, card):
        return False
    return SKINNY_GEMM_MODE == "all" or measured(m, n_rows, k, gated, card)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gemv_max_rows: int = 0
) -> torch.Tensor:
    """`x @ weight.T + bias`: cuBLAS, the Triton GEMV for inputs of at most `gemv_max_rows` rows where it
    measured faster (see above; 0, the default, keeps cuBLAS), or the skinny GEMM (above)."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] <= gemv_max_rows and weight.shape[0] <= TRITON_GEMV_MAX_OUT:
        from flotilla.kernels.triton_gemv import gemv

        return gemv(x, weight, bias)
    if _skinny_gemm_takes(x, weight):
        from flotilla.kernels.triton_skinny_gemm import skinny_gemm

        return skinny_gemm(x, weight, bias)
    if x.is_cuda and x.dim() == 2 and x.shape[0] <= max(gemv_max_rows, 1):
        from flotilla.kernels.triton_l2_prefetch import l2_prefetch

        # the one-row chain's cuBLAS projections (gate_up, the LM head): with FLOTILLA_PDL and FLOTILLA_PDL_L2_MB,
        # the weight's first part is asked of L2 while the kernel ahead runs (no-op otherwise)
        l2_prefetch(weight, x)
    return F.linear(x, weight, bias)


# The LM head at one row (`ParallelLMHead` -> `lm_head_linear`; Llama-3.1-8B: `[128,256, 4,096]` bf16, 1.05 GB a
# decode step, run eagerly after the step's graph). `linear` leaves it to cuBLAS: the head is no `_Linear`
# (--triton-gemv-max-rows never reaches it) and its rows exceed TRITON_GEMV_MAX_OUT. On an H100 cuBLAS's
# `nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT` streams it at ~2.83 TB/s (370.8 us, 14 % of the int4 bs1 step).
# FLOTILLA_LM_HEAD_GEMV (read at import): "0" cuBLAS; "1" the Triton GEMV at `default_config`'s tiles; or knobs, any
# subset of "bn=16,bk=512,sk=1,w=4,s=2,dot=0" (`LM_HEAD_KNOBS`; bench/lm_head_gemv.py prints its sweep's winner in
# this form), the GEMV with those tiles, on every card. Unset: the card's entry of LM_HEAD_GEMV_MEASURED
# (`card_tables.py`). DEFAULT: the sweep's winner on an H100 (session 20, bench/results/head20-gpu.sh): 335.4 vs
# cuBLAS's 372.3 us at Llama-3.1-8B's head (the same tiles won at 128,256 x 3,072 / 2,048; Qwen2.5-7B's head 353.3 vs
# 382.6 us), a bs1 ctx 512 step 5.706 -> 5.673 ms bf16 and 2.633 -> 2.597 ms int4, greedy tokens equal.
# No card has an entry of its own: session 25 call 5's H100 descent took one stage for the head (5.405 vs 5.411 ms a
# bf16 bs1 ctx 512 step in its confirm), and fresh engines on one H100 (session 26 call 3,
# bench/results/gpu-2026-12-06-s26/call3/) gave 5.427 ms with it against 5.416 without: nothing, not adopted.
LM_HEAD_KNOBS = KnobSyntax("FLOTILLA_LM_HEAD_GEMV", {"bn": "block_n", "bk": "block_k", "sk": "split_k",
                                                     "w": "num_warps", "s": "num_stages", "dot": "use_dot"},
                           values=range(1, 1 << 16), ranges={"dot": range(2)})  # fmt: skip


def lm_head_gemv_knobs(value: str) -> dict[str, Any] | None:
    """A FLOTILLA_LM_HEAD_GEMV value as `triton_gemv.gemv`'s keyword knobs: None for cuBLAS ("0", unset), `{}` for
    the default tiles ("1"), else the knob list (`LM_HEAD_KNOBS`, any case); a ValueError naming the variable for
    anything else."""
    spec = value.strip().lower()
    if "=" not in spec:
        return {} if parse_choice("FLOTILLA_LM_HEAD_GEMV", spec, {"0": False, "1": True}, False) else None
    knobs: dict[str, Any] = LM_HEAD_KNOBS.knobs(spec)
    if "use_dot" in knobs:
        knobs["use_dot"] = bool(knobs["use_dot"])
    return knobs


LM_HEAD_GEMV_MEASURED: dict[str, str] = {
    DEFAULT: "bn=16,bk=1024,w=4,s=2,dot=0",
    # session 29 call 1's in-engine descent (bench/results/gpu-2026-12-06-s29/call1/sweep25.log), with the bf16 tiles
    H200: "bn=8,bk=2048,sk=1,w=4,s=2,dot=0",
}
# The knobs per card (None: cuBLAS), the environment's on every card where set. The module global is read at every
# call: a benchmark sets `{DEFAULT: knobs}` in-process (every card's knobs).
LM_HEAD_GEMV: dict[str, dict[str, Any] | None] = {
    card: lm_head_gemv_knobs(spec)
    for card, spec in ({DEFAULT: os.environ["FLOTILLA_LM_HEAD_GEMV"]} if "FLOTILLA_LM_HEAD_GEMV" in os.environ
                       else LM_HEAD_GEMV_MEASURED).items()
}  # fmt: skip


def lm_head_gemv_for(card: str | None) -> dict[str, Any] | None:
    """The LM head's GEMV knobs on `card` (its own entry, else DEFAULT's); None: cuBLAS."""
    return for_card(LM_HEAD_GEMV, card)


def lm_head_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The LM head's logits `x @ weight.T`: one CUDA row takes the Triton GEMV with its card's knobs where the switch
    is on (above); everything else `linear` (cuBLAS, the skinny GEMM at decode batches where switched on)."""
    knobs = _lm_head_gemv_knobs(x)
    if knobs is not None:
        from flotilla.kernels.triton_gemv import gemv

        return gemv(x, weight, **knobs)
    return linear(x, weight)


def _lm_head_gemv_knobs(x: torch.Tensor) -> dict[str, Any] | None:
    """The GEMV's knobs for the hidden rows `x`: one CUDA row on a card where the switch is on (the card's name is
    looked up once per device); else None."""
    if not (x.is_cuda and x.dim() == 2 and x.shape[0] == 1):
        return None
    return lm_head_gemv_for(device_card(x))


def lm_head_gemv_takes(x: torch.Tensor) -> bool:
    """Whether `lm_head_linear` gives the hidden rows `x` to the Triton GEMV: one CUDA row, switched on for its card."""
    return _lm_head_gemv_knobs(x) is not None


def silu_and_mul_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gemv_max_rows: int = 0
) -> torch.Tensor:
    """`silu_and_mul(linear(x, weight, bias, gemv_max_rows))` for a merged gate/up weight `[2N, K]`: one
    skinny-GEMM launch with the gated epilogue where it takes the call, one gated-GEMV launch where that one
    does (FLOTILLA_GATED_GEMV), else the two steps."""
    if _skinny_gemm_takes(x, weight, gated=True):
        from flotilla.kernels.triton_skinny_gemm import skinny_gemm

        return skinny_gemm(x, weight, bias, gated=True)
    if _gated_gemv_takes(x, weight, bias, gemv_max_rows):
        from flotilla.kernels.triton_gated_gemv import gated_gemv

        return gated_gemv(x, weight, bias)
    return silu_and_mul(linear(x, weight, bias, gemv_max_rows))


# FLOTILLA_GATED_GEMV=1 (default on: measured on the H200, bf16 bs1 ctx512 4.490 -> 4.440 ms/step; "0" keeps
# cuBLAS + the SiLU kernel): a one-row gated gate/up projection (`silu_and_mul_linear`
# with one input row and --triton-gemv-max-rows >= 1, the batch-1 decode step) takes the gated GEMV
# (`triton_gated_gemv.py`: gate and up rows streamed by one kernel, `silu(gate) * up` written, launched by PDL)
# instead of cuBLAS's gate_up followed by the SiLU kernel; single-process engines only (tensor/pipeline parallel
# keep the two steps). docs/decode-gemm.md.
GATED_GEMV = env_flag("FLOTILLA_GATED_GEMV", True)
GATED_GEMV_MAX_ROWS = 1


def _gated_gemv_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gemv_max_rows: int) -> bool:
    """Whether the gated GEMV runs this gate/up projection (above)."""
    if not (GATED_GEMV and x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= min(gemv_max_rows, GATED_GEMV_MAX_ROWS)):
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    from flotilla.kernels.triton_gated_gemv import supported

    return supported(x, weight, bias)


# fp8 weights at decode: a linear call of at most FP8_GEMV_MAX_ROWS input rows runs W8A16 (the Triton
# fp8 GEMV on CUDA: activations read as they are, the weight upcast in registers) instead of W8A8.
# At one row the W8A8 path paid ~8 small kernels a layer to quantize the activation per token (abs,
# amax, divide, clamp, cast) plus cuBLASLt's fp8 GEMM with its smallest tile far wider than the batch:
# on the H200, Llama-3.1-8B decoded a batch of one in 6.87 ms, 1.50x the bf16 step (call E of
# 2026-12-03), when the halved weight bytes should make it faster. 16 rows is where the GEMV's
# `tl.dot` path stops being free: the batch is padded to 16 as the MMA's narrow side, so up to 16 rows
# cost the same weight stream as one; above it the padding doubles, and `_scaled_mm` at fp8 tensor-core
# rates amortises the per-token quantization over more rows. Decode CUDA graphs of batch 1, 2, 4, 8
# and 16 take the GEMV (M = the padded batch). Above the threshold the activation is quantized by one
# Triton kernel instead of ~8 torch ops. The before/after switch: FLOTILLA_FP8_GEMV=0 in the environment
# restores the path as call E measured it: W8A8 with torch's quantization (and the weight-only schemes'
# dequantize + matmul) at every batch size.
FP8_GEMV_MAX_ROWS = 16
FP8_GEMV_ENABLED = env_flag("FLOTILLA_FP8_GEMV", True)


# FLOTILLA_FP8_ROW_GEMV (read at import; the module global at every call), default on (session 16 call 2/3, an H100:
# the fp8 bs1 ctx 512 step 3.477 vs 3.839 ms, 0.608x the bf16 step of the same call; =0 restores `fp8_gemv`): a one-row
# W8A16 call on CUDA takes `triton_fp8_row_gemv.fp8_row_gemv` (register-pipelined, the weight read as int32 words,
# launched by PDL in the one-row chain) instead of `triton_gemv.fp8_gemv`; an fp8 Llama MLP at one row runs its
# gate/up projection and SiLU-and-mul as one launch of it (`fp8_gated_gemv_takes`), and an fp8 qkv projection its
# rotary + KV write in the epilogue (`fp8_qkv_rope_takes`, with FLOTILLA_QKV_ROPE). docs/quantization.md.
FP8_ROW_GEMV = env_flag("FLOTILLA_FP8_ROW_GEMV", True)


def _fp8_row_gemv_takes(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                        gated: bool = False) -> bool:  # fmt: skip
    """Whether the one-row fp8 GEMV runs this W8A16 call (above): switched on, CUDA, one row, operands it takes."""
    if not (FP8_ROW_GEMV and FP8_GEMV_ENABLED and x.is_cuda and math.prod(x.shape[:-1]) == 1):
        return False
    from flotilla.kernels.triton_fp8_row_gemv import supported

    return supported(x.reshape(1, x.shape[-1]), w_fp8, w_scale, bias, gated=gated)


def fp8_gated_gemv_takes(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                         bias: torch.Tensor | None) -> bool:  # fmt: skip
    """Whether an fp8 (W8A16 at decode) merged gate/up projection of `x` runs as `fp8_gated_gemv`: the one-row fp8
    GEMV switched on (FLOTILLA_FP8_ROW_GEMV), one row on CUDA, a single-process engine (tensor/pipeline parallel
    keep the two steps)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    return _fp8_row_gemv_takes(x, w_fp8, w_scale, bias, gated=True)


def fp8_qkv_rope_takes(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                       head_dim: int) -> bool:  # fmt: skip
    """Whether an fp8 (W8A16 at decode) qkv projection of `x` runs with rotary + the KV write in its epilogue
    (`qkv_rotary_and_write_kv` with `weight_scale`): the one-row fp8 GEMV switched on (FLOTILLA_FP8_ROW_GEMV), the
    fusion too (FLOTILLA_QKV_ROPE), one row on CUDA, a single-process engine, tiles that hold whole rotation pairs."""
    if not QKV_ROPE or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    if not (x.dim() == 2 and _fp8_row_gemv_takes(x, w_fp8, w_scale, bias)):
        return False
    from flotilla.kernels.triton_fp8_row_gemv import fuses_rope

    return fuses_rope(x, w_fp8, w_scale, bias, head_dim)


def fp8_gated_gemv(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """`silu_and_mul(fp8_weight_only_linear(x, w_fp8, w_scale, bias))` in one launch (where `fp8_gated_gemv_takes`),
    rounded as the pair rounds."""
    from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv

    out = fp8_row_gemv(x.reshape(1, x.shape[-1]), w_fp8, w_scale, bias, gated=True)
    return out.reshape(*x.shape[:-1], w_fp8.shape[0] // 2)


def _fp8_gemv_rows(x: torch.Tensor) -> bool:
    """True when `x` (rows of `x.shape[-1]` features) is small enough for the W8A16 GEMV."""
    return FP8_GEMV_ENABLED and math.prod(x.shape[:-1]) <= FP8_GEMV_MAX_ROWS


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with an fp8 weight and row-wise fp32 scales (`fp8_linear.py`). Up to
    FP8_GEMV_MAX_ROWS rows W8A16 (`fp8_weight_only_linear`, on the CPU too, so CI computes what the GPU
    does); above, W8A8: `torch._scaled_mm` on GPUs with fp8 tensor cores (Ada, Hopper and later), the
    fp32 reference elsewhere."""
    if _fp8_gemv_rows(x):
        return fp8_weight_only_linear(x, w_fp8, w_scale, bias)
    if x.is_cuda and fp8_tensor_cores(x.device) and x.shape[-1] % 16 == 0 and w_fp8.shape[0] % 16 == 0:
        from flotilla.kernels.fp8_scaled_mm import fp8_linear_scaled_mm

        return fp8_linear_scaled_mm(x, w_fp8, w_scale, bias, input_scale, fused_quant=FP8_GEMV_ENABLED)
    return fp8_linear_ref(x, w_fp8, w_scale, bias, input_scale)


def fp8_weight_only_linear(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * w_scale)^T + b`: the Triton fp8 GEMV (CUDA) or its reference up to
    FP8_GEMV_MAX_ROWS rows; above, the weight dequantized to `x`'s dtype and a dense matmul."""
    if _fp8_gemv_rows(x):
        if _fp8_row_gemv_takes(x, w_fp8, w_scale, bias):
            from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv

            return fp8_row_gemv(x.reshape(1, x.shape[-1]), w_fp8, w_scale, bias).reshape(*x.shape[:-1], -1)
        if x.is_cuda:
            from flotilla.kernels.triton_gemv import fp8_gemv

            return fp8_gemv(x, w_fp8, w_scale, bias)
        return fp8_weight_only_linear_ref(x, w_fp8, w_scale, bias)
    return F.linear(x, (w_fp8.float() * w_scale.float().reshape(-1, 1)).to(x.dtype), bias)


def int8_linear(
    x: torch.Tensor,
    w_int8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
    cpu_weight: CpuIntWeight | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with an int8 weight and fp32 per-row scales (compressed-tensors' W8A8, `int8_linear.py`), rows
    split as fp8 weights split them (FP8_GEMV_MAX_ROWS, above): up to it W8A16 (`int8_weight_only_linear`); above,
    W8A8: the activations rounded to int8 per token (or with the static `input_scale`; one Triton kernel on CUDA)
    and `torch._int_mm` where it runs, scaled into `x`'s dtype (one Triton kernel on CUDA)."""
    if _fp8_gemv_rows(x):
        return int8_weight_only_linear(x, w_int8, w_scale, bias, cpu_weight)
    rows = x.reshape(-1, x.shape[-1])
    if x.is_cuda:
        from flotilla.kernels.triton_int8_quant import quantize_int8_rows_triton

        x_int8, x_scale = quantize_int8_rows_triton(rows, input_scale)
    else:
        x_int8, x_scale = quantize_int8_activations(rows, input_scale)
    if x.is_cuda and int_mm_runs(x_int8, w_int8):  # the int32 product scaled in one pass (`triton_int8_scale.py`)
        from flotilla.kernels.triton_int8_scale import scale_int32_rows

        out = scale_int32_rows(torch._int_mm(x_int8, w_int8.t()), x_scale, w_scale, bias, x.dtype)
    else:
        out = int8_matmul(x_int8, x_scale, w_int8, w_scale, bias, x.dtype)
    return out.reshape(*x.shape[:-1], w_int8.shape[0])


def int8_weight_only_linear(x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor,
                            bias: torch.Tensor | None = None, cpu_weight: CpuIntWeight | None = None) -> torch.Tensor:
    """W8A16 `x @ (w_int8 * w_scale)^T + b`: on the CPU torch's int8 kernel where the layer prepared `cpu_weight` for
    `x`'s dtype (the 8-bit weight-only path of `packed_int_linear`), on CUDA the fp8 GEMV's kernel (`int8_gemv`),
    else the fp32 reference (`fp8_weight_only_linear_ref` reads any 8-bit weight)."""
    if cpu_weight is not None and not x.is_cuda and x.dtype == cpu_weight.scales.dtype:
        return cpu_int_linear(x, cpu_weight, bias)
    if x.is_cuda:
        from flotilla.kernels.triton_gemv import int8_gemv

        return int8_gemv(x, w_int8, w_scale, bias)
    return fp8_weight_only_linear_ref(x, w_int8, w_scale, bias)


def fp8_block_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * scale)^T + b` with one fp32 scale a `block` of the fp8 weight (`fp8_block_linear.py`), by
    `fp8_block_kernel`'s choice: on CUDA the per-channel fp8 GEMVs' block-scaled forms at decode (one row:
    `fp8_row_gemv_block`; up to FP8_GEMV_MAX_ROWS: `fp8_gemv_block`), the Triton block GEMM above, else the
    reference (the CPU path; on CUDA the same fp32 dequantize and matmul)."""
    kernel = fp8_block_kernel(x, w_fp8, scale, block, bias)
    if kernel == "row_gemv":
        from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_block

        out = fp8_row_gemv_block(x.reshape(1, x.shape[-1]), w_fp8, scale, block, bias)
        return out.reshape(*x.shape[:-1], w_fp8.shape[0])
    if kernel == "gemv":
        from flotilla.kernels.triton_gemv import fp8_gemv_block

        return fp8_gemv_block(x, w_fp8, scale, block, bias)
    if kernel == "gemm":
        from flotilla.kernels.triton_fp8_block_linear import fp8_block_linear as fp8_block_linear_triton

        return fp8_block_linear_triton(x, w_fp8, scale, block, bias)
    return fp8_block_linear_ref(x, w_fp8, scale, block, bias)


def nf4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    absmax: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with a bitsandbytes 4-bit weight (`nf4_linear.py`: codes through the 16-value table `values`
    times a float32 absmax a block of 64 inputs), at every row count: the Triton lookup-table GEMM on CUDA, else the
    reference (the CPU path)."""
    if x.is_cuda:
        from flotilla.kernels.triton_nf4_linear import nf4_linear as nf4_linear_triton

        return nf4_linear_triton(x, packed, absmax, values, bias)
    return nf4_linear_ref(x, packed, absmax, values, bias)


def fp8_block_kernel(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                     bias: torch.Tensor | None = None) -> str:  # fmt: skip
    """Which kernel `fp8_block_linear` runs: "ref" off CUDA or where the Triton kernels do not take the operands
    (blocks not a power of two of at least 16); at decode (FP8_GEMV_MAX_ROWS rows, FLOTILLA_FP8_GEMV on) the
    per-channel fp8 GEMVs with block scales, the same bytes at their speed: "row_gemv" at one row where
    FLOTILLA_FP8_ROW_GEMV is on and `block_supported` takes the operands, else "gemv"; above, "gemm"."""
    from flotilla.kernels.triton_fp8_block_linear import supported

    if not (x.is_cuda and supported(x, w_fp8, scale, block)):
        return "ref"
    if not _fp8_gemv_rows(x):
        return "gemm"
    if FP8_ROW_GEMV and math.prod(x.shape[:-1]) == 1:
        from flotilla.kernels.triton_fp8_row_gemv import block_supported

        if block_supported(x.reshape(1, x.shape[-1]), w_fp8, scale, block, bias):
            return "row_gemv"
    return "gemv"


def fp8_tensor_cores(device: torch.device) -> bool:
    """True on CUDA GPUs of compute capability 8.9 or later (fp8 matmuls in hardware)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


# Int4 weights on CUDA, by input rows (`triton_int4_gemm.py` says why): up to INT4_GEMV_MAX_ROWS the
# W4A16 GEMV (`triton_int4_gemv.py`: FMA up to 2 rows, tensor cores with the batch padded to 16 above,
# split-K where the row tiles are too few); up to INT4_GEMM_MAX_ROWS the dequantizing `tl.dot` GEMM;
# above, the weight dequantized in one pass and cuBLAS (a prefill, the start-up memory profile's 16,384
# rows). Leads, to be set from `bench/int4_gemv.py` on the H200.
INT4_GEMV_MAX_ROWS = 16
INT4_GEMM_MAX_ROWS = 256
# Int4 calls of up to INT4_GEMV_WIDE_ROWS rows with groups of a multiple of 32 take `int4_gemv_wide`
# (`triton_int4_gemv_wide.py`: 16-byte weight loads, the nibble-in-mantissa dequantize). FLOTILLA_INT4_GEMV_WIDE
# (read at import; the module global is read at every call): unset, one row (the H200, session 10 call 4: the int4
# bs1 step 4.188 -> 3.317 ms with the measured tiles, greedy tokens equal; 2-4 rows unmeasured); "1" 1..4 rows;
# "0" never.
INT4_GEMV_WIDE_ROWS = env_choice("FLOTILLA_INT4_GEMV_WIDE", {"1": 4, "0": 0}, 1)


def packed_int_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    group_size: int,
    bias: torch.Tensor | None = None,
    symmetric: bool = False,
    cpu_weight: CpuIntWeight | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with a packed integer weight (`packed_int_linear.py`): on CUDA, 4-bit weights take
    a Triton kernel by row count (above); on the CPU, torch's packed int4/int8 kernels when the layer
    prepared `cpu_weight` (`cpu_int_linear.py`) for `x`'s dtype; otherwise the reference (whole-weight
    dequantize). `symmetric`: every zero point is the middle code (the GEMV then reads none)."""
    if cpu_weight is not None and not x.is_cuda and x.dtype == cpu_weight.scales.dtype:
        return cpu_int_linear(x, cpu_weight, bias)
    if x.is_cuda and bits == 4:
        rows = math.prod(x.shape[:-1])
        if rows <= INT4_GEMV_WIDE_ROWS:
            from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, wide_supported

            if wide_supported(rows, x.shape[-1], group_size):
                return int4_gemv_wide(x, packed, scales, None if symmetric else zeros, group_size, bias)
        if rows <= INT4_GEMV_MAX_ROWS:
            from flotilla.kernels.triton_int4_gemv import int4_gemv

            return int4_gemv(x, packed, scales, None if symmetric else zeros, group_size, bias)
        from flotilla.kernels.triton_int4_gemm import int4_dequantize, int4_gemm_supported, int4_linear

        if rows <= INT4_GEMM_MAX_ROWS and int4_gemm_supported(x.shape[-1], group_size):
            return int4_linear(x, packed, scales, zeros, group_size, bias)
        return F.linear(x, int4_dequantize(packed, scales, zeros, group_size, x.dtype), bias)
    return packed_int_linear_ref(x, packed, scales, zeros, bits, group_size, bias)


# One-row int4 decode (W4A16, the wide GEMV above) with the work of the kernel behind in its epilogue
# (`triton_int4_gemv_fused.py`): the merged gate/up projection with SiLU-and-mul (FLOTILLA_INT4_GATED) and the qkv
# projection with rotary + the K/V cache write (FLOTILLA_INT4_QKV_ROPE): 2 launches a layer fewer. Read at import; the
# module globals at every call (bench/results/int4f20-gpu.sh flips them in-process): "1" (default) the fused form
# where `int4_gated_gemv_takes` / `int4_qkv_rope_takes`; "0" the pair. Outputs equal the pair's bit for bit.
INT4_GATED = env_flag("FLOTILLA_INT4_GATED", True)
INT4_QKV_ROPE = env_flag("FLOTILLA_INT4_QKV_ROPE", True)


def _int4_one_row(x: torch.Tensor) -> bool:
    """One CUDA row that `packed_int_linear` gives the wide GEMV, in a single-process engine (tensor/pipeline
    parallel keep the pairs)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    return x.is_cuda and x.dim() == 2 and x.shape[0] == 1 <= INT4_GEMV_WIDE_ROWS


def int4_gated_gemv_takes(x: torch.Tensor, weight: PackedInt4, bias: torch.Tensor | None) -> bool:
    """Whether an int4 merged gate/up projection of `x` runs as `int4_gated_gemv` (FLOTILLA_INT4_GATED)."""
    if not (INT4_GATED and _int4_one_row(x)):
        return False
    from flotilla.kernels.triton_int4_gemv_fused import fuses_gated

    return fuses_gated(x, *weight, bias)


def int4_gated_gemv(x: torch.Tensor, weight: PackedInt4, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`silu_and_mul(packed_int_linear(x, ...))` in one launch (where `int4_gated_gemv_takes`), rounded as the pair."""
    from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_gated

    return int4_gemv_wide_gated(x, *weight, bias)


def int4_qkv_rope_takes(x: torch.Tensor, weight: PackedInt4, bias: torch.Tensor | None, head_dim: int) -> bool:
    """Whether an int4 qkv projection of `x` runs with rotary + the KV write in its epilogue
    (`qkv_rotary_and_write_kv` given the `PackedInt4`; FLOTILLA_INT4_QKV_ROPE): one CUDA row, tiles that hold whole
    rotation pairs of a head."""
    if not (INT4_QKV_ROPE and _int4_one_row(x)):
        return False
    from flotilla.kernels.triton_int4_gemv_fused import fuses_rope

    return fuses_rope(x, *weight, bias, head_dim)


# LoRA kernel sets (FLOTILLA_LORA_KERNELS in the environment, read at start-up; the module global
# LORA_KERNELS is read at every call and when a LoRA layer is built):
# - "stacked" (2, the default): a plain projection (unquantized, bias-free, one rank) keeps every
#   slot's A stack as extra rows of its weight (engine/lora/layers.py), so the base GEMM computes each
#   slot's shrink too, and one expand per projection (`triton_lora_stacked.py`) writes base + deltas,
#   from 2 tokens to LORA_STACKED_MAX_TOKENS (decode batches; longer steps are compute-bound, where the
#   extra rows would cost FLOPs: they take the segment pair). The A stack joins the weight only while it
#   is at most LORA_STACKED_MAX_BYTES: at decode its bytes are read in every LoRA step's GEMM, whether
#   its slots are used or not, and 16 MiB is ~5 us of HBM on an H200, about one launch it saves.
#   One row keeps the GEMV-epilogue path below. Measured before it on the H200 (Llama-3.1-8B shape,
#   batch 64, 8 adapters): 128 shrink launches a step of 6.9 us each, 877 us of the 1,730 us of LoRA
#   kernel time (profile of 2026-12-03, sixth session).
# - "segments" (1): steps of at least LORA_SEGMENT_MIN_TOKENS tokens group their tokens by adapter
#   once per step (`lora_step_segments`) and run the segment pair (`triton_lora_segments.py`: one read
#   of each adapter's A and B tiles per 16 tokens of that adapter, on tensor cores); smaller steps keep
#   the per-token pair (`triton_lora.py`). Where the base projection takes the Triton GEMV (one row by
#   default: --triton-gemv-max-rows), the per-token expand is folded into the GEMV's epilogue
#   (`lora_linear`): 5 LoRA kernels a Llama layer instead of 8. H200: 1.12x at batch 1, 1.30x at
#   batch 64 (2026-12-03, fifth session). "stacked" keeps both where it does not stack.
# - "pair" (0): the per-token pair, unfused, at every size: 1.16x at batch 1, 1.50x at batch 64.
LORA_SEGMENT_MIN_TOKENS = 16
LORA_STACKED_MIN_TOKENS = 2
LORA_STACKED_MAX_TOKENS = 256
LORA_STACKED_MAX_BYTES = 16 << 20
LORA_KERNEL_SETS = {"0": "pair", "1": "segments", "2": "stacked"}


def lora_kernel_set(value: str) -> str:
    """A FLOTILLA_LORA_KERNELS value (0/1/2 or pair/segments/stacked) as its name."""
    by_name = {name: name for name in LORA_KERNEL_SETS.values()}
    return parse_choice("FLOTILLA_LORA_KERNELS", value, LORA_KERNEL_SETS | by_name, "stacked")


LORA_KERNELS = lora_kernel_set(os.environ.get("FLOTILLA_LORA_KERNELS", ""))


def lora_stacks_a(a_stack_bytes: int) -> bool:
    """Whether a plain projection keeps its A stack (`a_stack_bytes` over all slots) in its weight."""
    return LORA_KERNELS == "stacked" and a_stack_bytes <= LORA_STACKED_MAX_BYTES


def lora_step_segments(token_slots: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's tokens grouped by adapter slot (`(order, starts)`, one kernel on the device) for the
    segment and stacked kernels, or None where neither runs (the per-token pair or the reference)."""
    smallest = LORA_STACKED_MIN_TOKENS if LORA_KERNELS == "stacked" else LORA_SEGMENT_MIN_TOKENS
    if not (token_slots.is_cuda and LORA_KERNELS != "pair" and token_slots.shape[0] >= smallest):
        return None
    from flotilla.kernels.triton_lora_segments import lora_segments

    return lora_segments(token_slots, num_slots)


def lora_stacked_step(x: torch.Tensor, segments: tuple[torch.Tensor, torch.Tensor] | None) -> bool:
    """Whether a projection with its A stack in its weight takes the stacked GEMM + expand this step
    (on the CPU always: the reference expand)."""
    if LORA_KERNELS != "stacked" or x.dim() != 2:
        return False
    return not x.is_cuda or (segments is not None and x.shape[0] <= LORA_STACKED_MAX_TOKENS)


def lora_stacked_expand(y_ext: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
                        segments: tuple[torch.Tensor, torch.Tensor] | None, slice_sizes: tuple[int, ...],
                        max_rank: int) -> torch.Tensor:
    """`y` `[T, out]` from the stacked GEMM's `[T, out + slots * rows]` output: the base columns plus
    each token's delta from its slot's shrink columns (`lora_stacked_expand_ref`). CUDA: one Triton
    launch over the step's `segments`."""
    if y_ext.is_cuda and segments is not None:
        from flotilla.kernels.triton_lora_stacked import lora_stacked_expand as expand_triton

        return expand_triton(y_ext, b, segments, slice_sizes, max_rank)
    return lora_stacked_expand_ref(y_ext, b, token_slots, slice_sizes, max_rank)


def lora_apply(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
               slice_sizes: tuple[int, ...], max_rank: int,
               segments: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`y[t] += B[slot(t)] @ A[slot(t)] @ x[t]` per slice of a (merged) projection, in place; slot -1
    (the base model) leaves its row untouched. CUDA: one Triton shrink and one expand, by adapter
    segments when the step's `segments` (`lora_step_segments`) are given and it has at least
    LORA_SEGMENT_MIN_TOKENS tokens, else per token."""
    if y.is_cuda:
        if segments is not None and x.shape[0] >= LORA_SEGMENT_MIN_TOKENS:
            from flotilla.kernels.triton_lora_segments import lora_apply_segments

            lora_apply_segments(y, x, a, b, segments, slice_sizes, max_rank)
            return
        from flotilla.kernels.triton_lora import lora_apply as apply_triton

        apply_triton(y, x, a, b, token_slots, slice_sizes, max_rank)
        return
    lora_apply_ref(y, x, a, b, token_slots, slice_sizes, max_rank)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, gemv_max_rows: int, a: torch.Tensor, b: torch.Tensor,
                token_slots: torch.Tensor, slice_sizes: tuple[int, ...], max_rank: int) -> torch.Tensor | None:
    """`linear(x, weight)` (no bias) with each row's LoRA delta (`lora_apply`) in two launches: the
    shrink, then the Triton GEMV with the expand in its epilogue; None where `linear` would not take
    the GEMV or the GEMV's configuration has no room for the epilogue (the caller then adds the
    delta itself). The result equals `linear` followed by `lora_apply`'s per-token pair."""
    rows, k = x.shape if x.dim() == 2 else (0, 0)
    if not (LORA_KERNELS != "pair" and x.is_cuda and x.dim() == 2 and 0 < rows <= gemv_max_rows
            and weight.shape[0] <= TRITON_GEMV_MAX_OUT):
        return None
    from flotilla.kernels.triton_gemv import LoRAEpilogue, fuses_lora, gemv
    from flotilla.kernels.triton_lora import lora_shrink
    from flotilla.kernels.triton_utils import device_sms

    if not fuses_lora(rows, weight.shape[0], k, device_sms(x), device_card(x)):
        return None
    part = lora_shrink(x, a, token_slots)
    return gemv(x, weight, lora=LoRAEpilogue(part, b, token_slots, slice_sizes, max_rank))

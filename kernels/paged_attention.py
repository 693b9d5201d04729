"""Paged attention over the KV block pool: the PyTorch reference.

Layout (shared with the Triton kernels and the engine's cache allocator):
- `k_cache`, `v_cache`: `[num_blocks, block_size, num_kv_heads, head_dim]`, one pair per layer.
- A token's *slot* is `block_id * block_size + offset`; `slot_mapping[t] = -1` marks a padding token
  whose K/V must not be written (CUDA-graph padding).
- A batch is flattened: `query` is `[num_tokens, num_heads, head_dim]`; sequence `i` owns query rows
  `query_start_loc[i] : query_start_loc[i + 1]`, and `seq_lens[i]` is its total context length
  *including* those new tokens, whose K/V are written to the cache before attention runs. So the new
  token `j` of a sequence with `q_len` new tokens sits at position `seq_len - q_len + j` and attends to
  cache positions `0 ..= seq_len - q_len + j` (causal). Decode is the case `q_len == 1`; prefill with a
  cached prefix, or a chunk of a long prompt, is the general case.
- An fp8 (e4m3) cache holds `K / k_scale` and `V / v_scale` (per-layer scalars, 1.0 unless the
  checkpoint gives them). Attention dequantizes by folding the scales into the math: scores use
  `scale x k_scale` and the output is multiplied by `v_scale` (`kernels.dispatch.paged_attention`), so
  the kernels only upcast what they load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flotilla.kernels.fp8_linear import FP8_DTYPE, quantize_fp8_static


def write_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store `key`/`value` (`[num_tokens, num_kv_heads, head_dim]`) at their slots in the pool; an fp8
    pool gets `key / k_scale` and `value / v_scale`, saturated at +-448."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    _store(k_cache, slots, key[valid], k_scale)
    _store(v_cache, slots, value[valid], v_scale)


def _store(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, scale: float) -> None:
    flat = cache.view(-1, *cache.shape[2:])
    if cache.dtype == FP8_DTYPE:
        # torch has no fp8 index_copy on the CPU: copy the bytes.
        flat.view(torch.uint8).index_copy_(0, slots, quantize_fp8_static(rows, torch.tensor(scale)).view(torch.uint8))
    else:
        flat.index_copy_(0, slots, rows.to(cache.dtype))


def gather_kv_ref(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first `seq_len` cached tokens of one sequence, contiguous: `[seq_len, num_kv_heads, head_dim]`."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[H, Tq, D]`, k/v `[Hkv, Tk, D]` (grouped heads broadcast), mask `[Tq, Tk]` or batched, in fp32."""
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached context (see module docstring).

    Returns `[num_tokens, num_heads, head_dim]` in the query's dtype; accumulates in fp32.
    """
    q_starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [q_starts[i + 1] - q_starts[i] for i in range(len(lens))]
    if q_lens and max(q_lens) == 1 and len(q_lens) == query.shape[0]:
        return _decode_batched(query, k_cache, v_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(query)
    for i, (seq_len, q_len) in enumerate(zip(lens, q_lens, strict=True)):
        if q_len == 0:
            continue
        q = query[q_starts[i] : q_starts[i] + q_len].transpose(0, 1)  # [H, q_len, D]
        k = gather_kv_ref(k_cache, block_tables[i], seq_len).transpose(0, 1)
        v = gather_kv_ref(v_cache, block_tables[i], seq_len).transpose(0, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        mask = q_pos[:, None] >= torch.arange(seq_len, device=query.device)[None, :]
        out[q_starts[i] : q_starts[i] + q_len] = _attend(q, k, v, mask, scale).transpose(0, 1).to(query.dtype)
    return out


def _decode_batched(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence: gather every sequence's blocks at once and mask past its length."""
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :num_blocks].long().clamp(min=0)
    batch = query.shape[0]
    k = k_cache[table].reshape(batch, -1, *k_cache.shape[2:])[:, :max_len].transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[table].reshape(batch, -1, *v_cache.shape[2:])[:, :max_len].transpose(1, 2)
    mask = torch.arange(max_len, device=query.device)[None, :] < seq_lens[:, None].to(query.device)
    q = query.unsqueeze(2)  # [B, H, 1, D]
    out = _attend(q, k, v, mask[:, None, None, :], scale)  # [B, H, 1, D]
    return out.squeeze(2).to(query.dtype)

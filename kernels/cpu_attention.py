"""Paged attention for CPU tensors: the same function as the reference, arranged for speed.

The reference (`paged_attention.py`) is the oracle: simple, fp32, key/value heads repeated. Here the
query heads of a group are folded onto their shared key/value head instead, so K/V are never copied
per query head, and whole prompts use SDPA's causal fast path. Math stays in the model's dtype
(SDPA accumulates in fp32 internally); an fp8 cache's blocks are upcast to it as they are gathered.
Tests check it against the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flotilla.kernels.paged_attention import gather_kv_ref


def paged_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    step_memo: dict | None = None,
) -> torch.Tensor:
    """Causal paged attention of a flattened batch (layout in `paged_attention.py`). `step_memo`: the step's dict
    (`AttentionMetadata.derived`), where the first layer leaves the decode gather's indices for the others."""
    if max_query_len == 1:
        if step_memo is not None and k_cache.dtype == query.dtype:
            return _decode_memo(query, k_cache, v_cache, block_tables, seq_lens, scale, step_memo)
        return _decode(query, k_cache, v_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        first, last = starts[i], starts[i + 1]
        if last > first:
            out[first:last] = _extend(query[first:last], k_cache, v_cache, block_tables[i], seq_len, scale)
    return out


def _extend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """One sequence's `q_len` new tokens over its `seq_len` cached tokens: `[q_len, H, D]`."""
    q_len, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    k = gather_kv_ref(k_cache, table, seq_len).to(q.dtype).transpose(0, 1)[:, None]  # [Hkv, 1, L, D]
    v = gather_kv_ref(v_cache, table, seq_len).to(q.dtype).transpose(0, 1)[:, None]
    qg = q.transpose(0, 1).reshape(kv_heads, group, q_len, dim)
    k, v = k.expand(kv_heads, group, seq_len, dim), v.expand(kv_heads, group, seq_len, dim)
    if q_len == seq_len:
        out = F.scaled_dot_product_attention(qg, k, v, is_causal=True, scale=scale)
    else:
        positions = torch.arange(seq_len - q_len, seq_len)
        mask = positions[:, None] >= torch.arange(seq_len)[None, :]
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(heads, q_len, dim).transpose(0, 1)


def _decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence: a group's query heads become the query rows of their KV head."""
    batch, _, dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    table = block_tables[:, : -(-max_len // block_size)].long()
    k = k_cache[table].reshape(batch, -1, kv_heads, dim)[:, :max_len].to(query.dtype).transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[table].reshape(batch, -1, kv_heads, dim)[:, :max_len].to(query.dtype).transpose(1, 2)
    mask = (torch.arange(max_len)[None, :] < seq_lens[:, None])[:, None, None, :]
    return _grouped_sdpa(query, k, v, mask, scale)


def _decode_memo(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    memo: dict,
) -> torch.Tensor:
    """`_decode` with the per-step work done once for all layers (`decode_gather`): the same keys, values and
    SDPA call, so the same output."""
    k, v, mask = decode_gather(k_cache, v_cache, block_tables, seq_lens, query.shape[0], memo)
    return _grouped_sdpa(query, k, v, mask, scale)


def _grouped_sdpa(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """One query token a row `[B, H, D]` against keys and values `[B, Hkv, L, D]`: a KV head's group of query
    heads become the query rows of its SDPA call."""
    batch, heads, dim = query.shape
    kv_heads = k.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, dim)


def decode_gather(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    batch: int,
    memo: dict,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keys and values `[B, Hkv, L, D]` of a decode step's `batch` rows and SDPA's length mask, as `_decode`
    gathers them, with the per-step work done once for all layers and kept in `memo`: the slots each row reads
    (`[B * L]`, one `index_select` of the cache per layer instead of gathering whole blocks) and the mask (none
    for one row: every key up to the longest is its own). One row in consecutive blocks reads the pool as one
    strided view (its `view`s, slice and `transpose` in one `as_strided`), no gather."""
    block_size, kv_heads, dim = k_cache.shape[1:]
    found = memo.get("cpu_decode")
    if found is None:
        max_len = int(seq_lens.max())
        table = block_tables[:, : -(-max_len // block_size)].long().clamp_min(0)
        slots = (table[:, :, None] * block_size + torch.arange(block_size)).reshape(batch, -1)[:, :max_len]
        mask = None if batch == 1 else (torch.arange(max_len)[None, :] < seq_lens[:, None])[:, None, None, :]
        first = int(table[0, 0]) * block_size
        # one sequence in consecutive blocks (the block pool hands a lone request's blocks out in order): its keys
        # are one slice of the pool, a view instead of a gather
        run = first if batch == 1 and bool((slots[0] == first + torch.arange(max_len)).all()) else None
        found = memo["cpu_decode"] = (slots.reshape(-1), max_len, mask, run)
    slots, max_len, mask, run = found
    if run is not None and k_cache.is_contiguous() and v_cache.is_contiguous():
        row = kv_heads * dim
        size, stride = (1, kv_heads, max_len, dim), (max_len * row, dim, row, 1)
        k = k_cache.as_strided(size, stride, k_cache.storage_offset() + run * row)
        v = v_cache.as_strided(size, stride, v_cache.storage_offset() + run * row)
        return k, v, mask
    k = k_cache.view(-1, kv_heads, dim).index_select(0, slots).view(batch, max_len, kv_heads, dim)
    v = v_cache.view(-1, kv_heads, dim).index_select(0, slots).view(batch, max_len, kv_heads, dim)
    return k.transpose(1, 2), v.transpose(1, 2), mask  # the caller sends only a cache of q's dtype here

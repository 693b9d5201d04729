"""Batched LoRA (shrink and expand with a per-token adapter index): the PyTorch reference.

A step mixes tokens of the base model and of several adapters. Every adapter resident on the device
has a slot; `token_slots[t]` is the slot of token `t`'s adapter, or -1 for the base model. The LoRA
delta of a projection is `expand(shrink(x))`:

- shrink: `buf[t] = A[slot(t)] @ x[t]`, with `A` stacked over slots as `[slots, rank, in]`;
- expand: `y[t] += B[slot(t)] @ buf[t]`, with `B` `[slots, out, rank]` (the scaling folded in),
  added in place into `y`, which may be a column slice of a merged projection's output.

`lora_apply_ref` is a whole projection: one shrink over the stacked A of every slice (QKV, gate/up),
then one expand per slice into its columns; the Triton pair (`triton_lora.py`) computes the same.
`lora_stacked_expand_ref` is the expand of a projection whose base GEMM also computed every slot's
shrink (the A stack as extra output rows, `triton_lora_stacked.py`): it reads a token's own slot's
columns of that output and returns the base columns plus the deltas.

Accumulation is in fp32 and each result rounded once to the output dtype, as the Triton kernels do.
"""

from __future__ import annotations

import torch


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """`[T, in]` x, `[S, R, in]` A, `[T]` slots -> `[T, R]` (zero rows for base-model tokens)."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=x.dtype, device=x.device)
    for slot in token_slots.unique().tolist():
        if slot < 0:
            continue
        rows = token_slots == slot
        out[rows] = (x[rows].float() @ a[slot].float().T).to(x.dtype)
    return out


def lora_expand_ref(y: torch.Tensor, buf: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor) -> None:
    """`y[t] += B[slot(t)] @ buf[t]` in place, for `y` `[T, out]`, buf `[T, R]`, B `[S, out, R]`."""
    for slot in token_slots.unique().tolist():
        if slot < 0:
            continue
        rows = token_slots == slot
        delta = buf[rows].float() @ b[slot].float().T
        y[rows] = (y[rows].float() + delta).to(y.dtype)


def lora_apply_ref(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
                   slice_sizes: tuple[int, ...], max_rank: int) -> None:
    """A projection's delta in place: `y` `[T, out]`, `x` `[T, in]`, `a` `[S, n_slices * max_rank, in]`,
    `b` `[S, out, max_rank]`; slice `i` owns A rows `i * max_rank ...` and its columns of `y` and `b`."""
    buf = lora_shrink_ref(x, a, token_slots)
    offset = 0
    for i, size in enumerate(slice_sizes):
        rows = buf[:, i * max_rank : (i + 1) * max_rank]
        lora_expand_ref(y[:, offset : offset + size], rows, b[:, offset : offset + size], token_slots)
        offset += size


def lora_stacked_expand_ref(y_ext: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
                            slice_sizes: tuple[int, ...], max_rank: int) -> torch.Tensor:
    """`y` `[T, out]` from `y_ext` `[T, out + S * rows]` = `x @ [W; A[0]; ...; A[S-1]]^T` (A `[S, rows,
    in]` with `rows = n_slices * max_rank`, `b` `[S, out, max_rank]`): the base columns, plus for each
    adapter token the deltas of its slot's shrink columns (already rounded, as `lora_shrink_ref` rounds)."""
    slots, n, _ = b.shape
    t = y_ext.shape[0]
    rows = len(slice_sizes) * max_rank
    y = y_ext[:, :n].clone(memory_format=torch.contiguous_format)
    per_slot = y_ext[:, n:].reshape(t, slots, rows)
    buf = per_slot[torch.arange(t, device=y_ext.device), token_slots.clamp(min=0)]  # [T, rows]: own slot's
    offset = 0
    for i, size in enumerate(slice_sizes):
        lora_expand_ref(y[:, offset : offset + size], buf[:, i * max_rank : (i + 1) * max_rank],
                        b[:, offset : offset + size], token_slots)
        offset += size
    return y

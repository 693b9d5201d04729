"""Top-k and top-p truncation of logits, without sorting whole rows on the CPU.

The rule is the full-row sort's (`top_k_top_p_by_sort`, what runs on other devices): sort the row ascending, mask
what lies below the k-th largest, and drop the sorted prefix whose cumulative softmax stays <= 1 - p. On the CPU
that sort cost ~4 ms a row at V 49,152, 8x the rest of `sample()`. `apply_top_k_top_p` keeps the same tokens, bit
for bit, from less work:

- The cumulative softmax depends on the row's values in ascending order, not on which token holds which: it is
  computed on that same [n, V] tensor (so the same floating-point sums), built from `topk` when k is small (the
  masked part is -inf either way) or else sorted as values alone (NumPy's sort, ~4x faster than torch's with
  its indices).
- The top-p cut is then a value: every token below it drops, and so do the tokens equal to it when all of them
  fall before the cut. When the cut splits a group of tied tokens (bf16 logits tie often), which ones stay is the
  order torch's unstable sort gives them, an artefact of its algorithm: only those rows take the full sort.
- Rows that drop nothing (no k, p = 1, no probability that can round to 0) are left as they are.
"""

from __future__ import annotations

import numpy as np
import torch

_NEG_INF = float("-inf")
# A kept value at most this far below its row's max has a probability of at least exp(-80) / V, not 0 in float32 for
# any V below 2^20: top-p at p = 1 (which drops a sorted prefix whose cumulative is exactly 0) cannot drop it.
_UNDERFLOW_GAP = 80.0
# Largest k (ties with the k-th included) whose rows take `topk` rather than a sort of their values: at V 49,152
# topk(4,096) costs ~2/3 of NumPy's sort.
_TOPK_MAX = 4096
# How many values past the largest k `topk` takes: ties with the k-th among them need no count over the row.
_TIES_SEEN = 16


def top_k_top_p_by_sort(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's k most likely tokens (ties at the boundary kept), then its smallest set whose
    probability reaches top_p (the most likely token always stays); by sorting each whole row."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, _NEG_INF)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's k most likely tokens (ties at the boundary kept), then its smallest set whose
    probability reaches top_p (the most likely token always stays). A new tensor; the same as
    `top_k_top_p_by_sort`, which other devices than the CPU and other dtypes than float32/float64 run."""
    rows, vocab = logits.shape
    # Half-precision softmaxes underflow within `_UNDERFLOW_GAP` (and NumPy has no bfloat16): the full sort.
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or not rows or not vocab:
        return top_k_top_p_by_sort(logits, top_k, top_p)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    small_k = (k < vocab) & (k <= _TOPK_MAX)
    kth = logits.new_full((rows,), _NEG_INF)  # -inf: top-k drops nothing
    hi = logits.new_empty(rows)  # each row's max (NaN where it holds a NaN)
    top = logits.new_empty(rows, 0)  # small-k rows: their largest values, descending (NaN first, as torch's max)
    picked = small_k.nonzero().flatten()
    if picked.numel():
        # A few more than k: the count of ties with the k-th then rarely needs a pass over the row.
        top = logits.new_full((rows, min(vocab, int(k[picked].max()) + _TIES_SEEN)), _NEG_INF)
        top[picked] = _rows(logits, picked).topk(top.shape[1], dim=-1).values
        kth[picked] = top[picked].gather(1, (k[picked] - 1).unsqueeze(1)).squeeze(1)
        hi[picked] = top[picked, 0]
    others = (~small_k).nonzero().flatten()
    if others.numel():
        hi[others] = _rows(logits, others).amax(dim=1)
    top_p_rows = _rows_top_p_may_change(logits, kth, hi, top_p)
    cut = logits.new_full((rows,), _NEG_INF)  # top-p drops every token <= cut
    split: list[torch.Tensor] = []
    for group, by_sort in ((top_p_rows & small_k, False), ((top_p_rows | (k < vocab)) & ~small_k, True)):
        picked = group.nonzero().flatten()
        if picked.numel():
            values = _rows(logits, picked)
            if by_sort:
                kth[picked], masked_sorted = _masked_sorted_by_sort(values, k[picked])
            else:
                masked_sorted = _masked_sorted_from_top(values, kth[picked], top[picked])
            last, whole = _top_p_cut(masked_sorted, top_p[picked])
            # Rows here only for their k-th (a large k) drop nothing more: a NaN softmax's cumulative holds no cut.
            needed = top_p_rows[picked]
            cut[picked] = torch.where(needed, last, _NEG_INF)
            split.append(picked[needed & ~whole])
    out = _drop_below(logits, kth, cut)
    tied = torch.cat(split) if split else picked[:0]
    if tied.numel():
        out[tied] = top_k_top_p_by_sort(logits[tied], top_k[tied], top_p[tied])
    return out


def _rows(logits: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """`logits[picked]`, without the copy when `picked` is every row (in order, as `nonzero` lists them)."""
    return logits if picked.numel() == logits.shape[0] else logits[picked]


def _drop_below(logits: torch.Tensor, kth: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` with -inf for the values below `kth` and those <= `cut` ([B] each); only the rows where
    either drops anything are compared."""
    active = ((kth > _NEG_INF) | (cut > _NEG_INF)).nonzero().flatten()
    if active.numel() == logits.shape[0]:
        return logits.masked_fill((logits < kth.unsqueeze(1)) | (logits <= cut.unsqueeze(1)), _NEG_INF)
    out = logits.clone()
    if active.numel():
        out[active] = _drop_below(logits[active], kth[active], cut[active])
    return out


def _rows_top_p_may_change(logits: torch.Tensor, kth: torch.Tensor, hi: torch.Tensor,
                           top_p: torch.Tensor) -> torch.Tensor:
    """[B] bool: rows where top-p may drop a token that top-k keeps. Not where the max `hi` is not finite (NaN,
    +inf, all -inf): the softmax is NaN and drops nothing. At p = 1 only a probability of exactly 0 drops, so only
    a row whose smallest kept finite value is far below its max."""
    unsure = hi.isfinite() & (top_p >= 1)
    lowest = kth.clone()  # the smallest value top-k keeps: the k-th largest when finite, else the row's least finite
    floorless = (unsure & (kth == _NEG_INF)).nonzero().flatten()
    if floorless.numel():
        values = _rows(logits, floorless)
        lowest[floorless] = values.masked_fill(values == _NEG_INF, float("inf")).amin(dim=1)
    return (hi.isfinite() & (top_p < 1)) | (unsure & (lowest - hi < -_UNDERFLOW_GAP))


def _top_p_cut(masked_sorted: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([n] the value top-p's cut drops every token <= of (-inf: none beyond top-k's), [n] bool: the cut drops
    whole groups of equal values, not part of a group of tied tokens); meaningful where the max is finite."""
    cumulative = torch.softmax(masked_sorted, dim=-1).cumsum(dim=-1)
    # The count of `top_k_top_p_by_sort`'s drop mask: a cumulative of probabilities >= 0 never decreases.
    threshold = (1 - top_p).unsqueeze(1)
    dropped = torch.searchsorted(cumulative, threshold, right=True).clamp_(max=masked_sorted.shape[1] - 1)
    last = masked_sorted.gather(1, (dropped - 1).clamp(min=0))
    # A last dropped value of -inf drops only tokens top-k dropped or that were -inf already.
    last = torch.where((dropped > 0) & (last > _NEG_INF), last, _NEG_INF)
    # The prefix ends after a whole group of equal values iff as many sorted values are <= its last one (for a
    # finite last one, masking the values below the k-th, which is <= it, changes no count).
    whole = (last == _NEG_INF) | (torch.searchsorted(masked_sorted, last, right=True) == dropped)
    return last.squeeze(1), whole.squeeze(1)


def _masked_sorted_from_top(values: torch.Tensor, kth: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """[n, V]: each row ascending with the values below its k-th largest -inf, the same tensor bit for bit as the
    full sort's, from the row's largest values `top` (a new topk when ties with the k-th outnumber them)."""
    vocab = values.shape[1]
    if bool((top[:, -1] >= kth).any()) and top.shape[1] < vocab:  # ties with the k-th may lie beyond `top`
        top = values.topk(int((values >= kth.unsqueeze(1)).sum(dim=1).max()), dim=-1).values
    width = int((top >= kth.unsqueeze(1)).sum(dim=1).max())
    top = top[:, :width].flip(-1)
    out = torch.full_like(values, _NEG_INF)
    out[:, vocab - width :] = top.masked_fill(top < kth.unsqueeze(1), _NEG_INF)
    return out


def _masked_sorted_by_sort(values: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k-th largest [n], [n, V] each row ascending with the values below it -inf): the full sort's values,
    sorted by NumPy without indices (the order of equal values is not needed; +0.0 and -0.0 give the same
    softmax)."""
    vocab = values.shape[1]
    ascending = torch.from_numpy(np.sort(values.numpy(), axis=-1))
    kth = ascending.gather(1, (vocab - k).unsqueeze(1))
    return kth.squeeze(1), ascending.masked_fill(ascending < kth, _NEG_INF)

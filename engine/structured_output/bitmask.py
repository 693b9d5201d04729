"""Token bitmasks for one step's rows: filled on the host from each row's grammar, 32 tokens per int32."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from flotilla.engine.structured_output.matcher import RequestGrammar


def step_bitmask(grammars: Sequence[RequestGrammar | None], vocab_size: int) -> torch.Tensor | None:
    """`[rows, ceil(vocab/32)]` int32 masks (bit set = allowed), or None when no row is constrained.

    Rows without a grammar, or whose completion still thinks, allow every token. On a GPU the caller launches this
    while the device still runs the step's forward pass, so the host's work hides behind it.
    """
    if all(g is None or not g.constraining for g in grammars):  # free, or still thinking (thinking.py)
        return None
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)  # all bits set
    for row, grammar in enumerate(grammars):
        if grammar is not None:
            grammar.fill_bitmask(bitmask, row)
    return bitmask

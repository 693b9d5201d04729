"""Where a thinking model's grammar starts: after its `</think>`, so that the thinking runs free.

With `--reasoning-parser`, vLLM applies a request's grammar (response_format, structured_outputs, a forced tool
call) to the answer only: the matcher neither masks nor advances while the request still thinks, and starts at the
token after the end marker. Whether a request still thinks is read from token ids, as vLLM's reasoning parsers do:
its prompt, read from the end, thinks when `<think>` comes before any `</think>` (deepseek_r1's template opens it)
or when it has neither (qwen3's model opens it itself); a prompt whose last marker is `</think>` (a template run
with `enable_thinking: false` writes `<think>\n\n</think>`) has ended its thinking, so the grammar applies from the
first token. A model that never writes `</think>` is never constrained. `--structured-outputs-config`'s
`enable_in_reasoning` (vLLM's key) applies the grammar from the first token whatever the prompt.

This lives in the grammar's own state (matcher.py's RequestGrammar), so the scheduler, the sampler and the bitmask
path see a grammar that allows every token while its request thinks, and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkingMarkers:
    """The token ids of `<think>` and `</think>` in a model's vocabulary."""

    start_id: int
    end_id: int

    def ended(self, token_ids: Sequence[int]) -> bool:
        """True when `token_ids` (a prompt) has ended its thinking: its last marker is `</think>`."""
        ids = list(token_ids)
        if self.end_id not in ids:  # list scans run in C: no Python loop over a long prompt
            return False
        last_end = len(ids) - 1 - ids[::-1].index(self.end_id)
        return self.start_id not in ids[last_end + 1 :]


def thinking_markers(tokenizer: Any) -> ThinkingMarkers | None:
    """The markers' ids when both are single tokens of `tokenizer` (as in Qwen3's and DeepSeek-R1's vocabularies),
    else None: the grammar then cannot see the thinking end and applies from the first token."""
    vocab = tokenizer.get_vocab()
    start, end = vocab.get(START), vocab.get(END)
    if start is None or end is None:
        return None
    return ThinkingMarkers(int(start), int(end))

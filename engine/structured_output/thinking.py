"""Where a thinking model's grammar starts: after its `</think>`, so that the thinking runs free.

With `--reasoning-parser`, vLLM applies a request's grammar (response_format, structured_outputs, a forced tool
call) to the answer only: the matcher neither masks nor advances while the request still thinks, and starts at the
token after the end marker. Whether a request still thinks is read from token ids, as vLLM's reasoning parsers do:
its prompt, read from the end, thinks when `<think>` comes before any `</think>` (deepseek_r1's template opens it)
or when it has neither (qwen3's model opens it itself); a prompt whose last marker is `</think>` (a template run
with `enable_thinking: false` writes `<think>\n\n</think>`) has ended its thinking, so the grammar applies from the
first token. A model that never writes `</think>` is never constrained. `--structured-outputs-config`'s
`enable_in_reasoning` (vLLM's key) applies the grammar from the first token whatever the prompt.

With the qwen3 parser a tool call ends the thinking too, as in vLLM's Qwen3 parser (Qwen3.5 may open a call inside
its thinking without closing it): a `<tool_call>` token followed, within 8 tokens, by whitespace and `<function=`
(or `<function `), the XML call format of Qwen3.5 and Qwen3-Coder. The grammar starts at the token after the one that
completes `<function=`; a `<tool_call>` that goes on otherwise (a mention in the thinking, a JSON call) does not end
it. In a prompt, only a `<tool_call>` that no `</tool_call>` follows counts (the tools' examples in a system prompt
are closed). `calls_from` gives the same rule on text, for the reply's split (engine/server/reasoning.py).

This lives in the grammar's own state (matcher.py's RequestGrammar), so the scheduler, the sampler and the bitmask
path see a grammar that allows every token while its request thinks, and nothing else changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

START, END = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# vLLM's lookahead after <tool_call>: tokens, and (here) the whitespace before `<function`, so that a held-back
# stream tail stays bounded.
CALL_LOOKAHEAD_TOKENS = 8
CALL_MAX_SPACE = 16
_FUNCTION = "<function"
_OPENS_CALL = re.compile(rf"\s{{0,{CALL_MAX_SPACE}}}<function[\s=]")


def call_follows(after: str) -> bool | None:
    """Whether the text after a `<tool_call>` opens a call (whitespace, then `<function=` or `<function `): True,
    False, or None while it cannot tell yet (whitespace, or a beginning of `<function`, and nothing else)."""
    if _OPENS_CALL.match(after):
        return True
    stripped = after.lstrip()
    if len(after) - len(stripped) > CALL_MAX_SPACE:
        return False
    return None if _FUNCTION.startswith(stripped) else False


@dataclass(frozen=True)
class CallMarkers:
    """qwen3's `<tool_call>` and `</tool_call>` ids (the closing one may be absent), and the tokenizer's decode."""

    open_id: int
    close_id: int | None
    decode: Callable[[list[int]], str] = field(compare=False, repr=False)

    def confirmed_at(self, ids: list[int], first: int) -> int | None:
        """The index of the token that completes the first call opening found at or after `first` (its
        `<tool_call>` at `first` or later): where the thinking ends. None: none yet."""
        pos = first
        while True:
            try:
                pos = ids.index(self.open_id, pos)
            except ValueError:
                return None
            for k in range(pos + 1, min(pos + CALL_LOOKAHEAD_TOKENS, len(ids) - 1) + 1):
                verdict = call_follows(self.decode(ids[pos + 1 : k + 1]))
                if verdict is not None:
                    if verdict:
                        return k
                    break
            pos += 1


@dataclass(frozen=True)
class ThinkingMarkers:
    """The token ids of `<think>` and `</think>` in a model's vocabulary, and qwen3's call markers (None for other
    parsers, or where `<tool_call>` is not one token)."""

    start_id: int
    end_id: int
    calls: CallMarkers | None = None

    def ended(self, token_ids: Sequence[int]) -> bool:
        """True when `token_ids` (a prompt) has ended its thinking: its last marker is `</think>`, or (qwen3) a call
        opening that no `</think>`, `<think>` or `</tool_call>` follows."""
        ids = list(token_ids)
        last_start, last_end = _last(ids, self.start_id), _last(ids, self.end_id)
        if last_end > last_start:
            return True
        if self.calls is None:
            return False
        first = max(last_start, _last(ids, self.calls.close_id)) + 1
        return self.calls.confirmed_at(ids, first) is not None

    def opened(self, token_ids: Sequence[int]) -> bool:
        """True when `token_ids` (a prompt) opened the thinking: its last marker is `<think>` (deepseek_r1's template,
        Qwen3.5's and Qwen3-Thinking-2507's), so the output starts inside it."""
        ids = list(token_ids)
        return _last(ids, self.start_id) > _last(ids, self.end_id)

    def end_in(self, output: list[int], start: int) -> int | None:
        """The index of the token that ends the thinking, in `output` from `start` on (a call opened up to
        CALL_LOOKAHEAD_TOKENS before `start` may complete there), or None while it still thinks."""
        try:
            end: int | None = output.index(self.end_id, start)
        except ValueError:
            end = None
        call = None if self.calls is None else self.calls.confirmed_at(output, max(0, start - CALL_LOOKAHEAD_TOKENS))
        found = [i for i in (end, call) if i is not None]
        return min(found) if found else None


def _last(ids: list[int], token: int | None) -> int:
    """The index of `token`'s last occurrence in `ids`, -1 when absent (list scans run in C: no Python loop)."""
    if token is None or token not in ids:
        return -1
    return len(ids) - 1 - ids[::-1].index(token)


def thinking_markers(tokenizer: Any, parser: str | None = None) -> ThinkingMarkers | None:
    """The markers' ids when both are single tokens of `tokenizer` (as in Qwen3's and DeepSeek-R1's vocabularies),
    else None: the grammar then cannot see the thinking end and applies from the first token. With `parser` qwen3,
    also `<tool_call>`'s (and `</tool_call>`'s) when it is a single token."""
    vocab = tokenizer.get_vocab()
    start, end = vocab.get(START), vocab.get(END)
    if start is None or end is None:
        return None
    calls = None
    if parser == "qwen3" and vocab.get(CALL_OPEN) is not None:
        close = vocab.get(CALL_CLOSE)

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=False))

        calls = CallMarkers(int(vocab[CALL_OPEN]), int(close) if close is not None else None, decode)
    return ThinkingMarkers(int(start), int(end), calls)

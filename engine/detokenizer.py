"""Incremental detokenization: text deltas per new token, never a broken UTF-8 character."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of output tokens into text, one delta at a time.

    Each step decodes only a short window (a few tokens before the new ones give the tokenizer its
    spacing context) and holds text back while it ends in U+FFFD, i.e. while a multi-byte
    character is still incomplete.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decode = decoder(tokenizer, skip_special_tokens)
        self.token_ids = list(prompt_token_ids[-6:])
        self.prefix_offset = max(len(self.token_ids) - 5, 0)
        self.read_offset = len(self.token_ids)
        self.text = ""

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (possibly empty)."""
        self.token_ids.extend(new_token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: whatever is still held back, as decoded."""
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.read_offset = len(self.token_ids)
        self.prefix_offset = self.read_offset
        self.text += delta
        return delta


def decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """`tokenizer.decode` for a list of ids, as a one-argument function.

    For a plain HF fast tokenizer that does no clean-up, HF's `decode` only forwards to the Rust
    tokenizer's, after ~2 us of argument checks; the detokenizer calls it twice per token per request
    every step, so it calls the Rust one directly. Any other tokenizer goes through its own `decode`.
    """
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    cls = type(tokenizer)
    plain = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
    if plain:
        rust = tokenizer._tokenizer
        return lambda ids: rust.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

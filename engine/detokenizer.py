"""Incremental detokenization: text deltas per new token, never a broken UTF-8 character."""

from __future__ import annotations

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
        self.token_ids = list(prompt_token_ids[-6:])
        self.prefix_offset = max(len(self.token_ids) - 5, 0)
        self.read_offset = len(self.token_ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

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

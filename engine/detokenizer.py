"""Incremental detokenization: text deltas per new token, never a broken UTF-8 character."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of output tokens into text, one delta at a time.

    For a plain HF fast tokenizer, the Rust `DecodeStream` decodes each token once, keeping its own
    state (it holds bytes back while a multi-byte character is incomplete): one call per token per
    request, on the engine thread, instead of two decodes of a window. Otherwise each step decodes
    only a short window (a few tokens before the new ones give the tokenizer its spacing context) and
    holds text back while it ends in U+FFFD, i.e. while a multi-byte character is still incomplete.

    `spaces_between_special_tokens=False` (vLLM's, with special tokens kept) writes an added token that follows
    another one as its bare text, without the space a decoder such as WordPiece's puts before it.

    The text is kept as the list of its deltas, joined only when read whole (`text`): `self.text += delta` on an
    attribute copies the whole text every step, O(output length) per request per step. `text_between` reads the
    tail that stop strings search and delta outputs send, in time proportional to that tail.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 decode_stream: bool = True, spaces_between_special_tokens: bool = True) -> None:
        """`decode_stream=False` forces the window decoding (the reference the streamed one must match)."""
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # As vLLM: only with special tokens kept, and only for a tokenizer that has added tokens.
        unspaced = not (skip_special_tokens or spaces_between_special_tokens)
        self._added = added_token_texts(tokenizer) if unspaced else {}
        self._last_added = False  # the last output token was an added one (the prompt's do not count, as vLLM)
        self._decode = decoder(tokenizer, skip_special_tokens)
        self.token_ids = list(prompt_token_ids[-6:])
        self.prefix_offset = max(len(self.token_ids) - 5, 0)
        self.read_offset = len(self.token_ids)
        self._pieces: list[str] = []
        self.num_chars = 0  # len(self.text)
        self._rust = _plain_rust_tokenizer(tokenizer) if decode_stream else None
        if self._rust is not None and self._decode(self.token_ids).endswith("\ufffd"):
            # A prompt cut inside a character: the stream would hold its tail back as incomplete and emit it
            # with the first output token (prompt text in the output); the window decoding leaves it out.
            self._rust = None
        self._stream: Any = None
        if self._rust is not None:
            from tokenizers.decoders import DecodeStream

            # The prompt's tail gives the first output token its spacing context, as the window does.
            self._stream = DecodeStream(ids=list(self.token_ids), skip_special_tokens=skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (possibly empty)."""
        if self._added:
            delta = "".join(self._add_unspaced(token) for token in new_token_ids)
        else:
            delta = self._add(new_token_ids)
        if delta:  # `_append`, inline: this runs per request per step
            self._pieces.append(delta)
            self.num_chars += len(delta)
        return delta

    @property
    def text(self) -> str:
        """The whole text so far (joined once, then kept as one piece)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def text_between(self, start: int, end: int) -> str:
        """`self.text[start:end]` for a `start` near the end, joining only the pieces from there."""
        pieces = self._pieces
        if not pieces or start >= end:
            return ""
        last = pieces[-1]
        offset = self.num_chars - len(last)
        if start >= offset:  # within the last piece (a step's delta): no join
            return last[start - offset : end - offset]
        i = len(pieces) - 1
        while i > 0 and offset > start:
            i -= 1
            offset -= len(pieces[i])
        return "".join(pieces[i:])[start - offset : end - offset]

    def cut(self, keep: int) -> None:
        """Keep only the text's first `keep` characters (a stop string and what follows it are cut)."""
        text = self.text[:keep]
        self._pieces, self.num_chars = [text], len(text)

    def _append(self, delta: str) -> None:
        if delta:
            self._pieces.append(delta)
            self.num_chars += len(delta)

    def _add(self, new_token_ids: list[int]) -> str:
        if self._stream is not None:
            return self._add_streamed(new_token_ids)
        return self._add_window(new_token_ids)

    def _add_unspaced(self, token: int) -> str:
        """One token, an added token right after another written as its bare text."""
        delta = self._add([token])
        added = self._added.get(token)
        if added is not None and self._last_added and delta:
            delta = added
        self._last_added = added is not None
        return delta

    def _add_window(self, new_token_ids: list[int]) -> str:
        self.token_ids.extend(new_token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return delta

    def _add_streamed(self, new_token_ids: list[int]) -> str:
        pieces = []
        for token in new_token_ids:
            self.token_ids.append(token)
            piece = self._stream.step(self._rust, token)
            if piece is not None:  # every token so far is in the text: the window restarts here
                pieces.append(piece)
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.token_ids)
        return "".join(pieces)

    def flush(self) -> str:
        """At the end of a request: whatever is still held back, as decoded."""
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.read_offset = len(self.token_ids)
        self.prefix_offset = self.read_offset
        self._append(delta)
        return delta


def decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """`tokenizer.decode` for a list of ids, as a one-argument function.

    For a plain HF fast tokenizer that does no clean-up, HF's `decode` only forwards to the Rust
    tokenizer's, after ~2 us of argument checks; the detokenizer calls it twice per token per request
    every step, so it calls the Rust one directly. Any other tokenizer goes through its own `decode`.
    """
    rust = _plain_rust_tokenizer(tokenizer)
    if rust is not None:
        return lambda ids: rust.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def added_token_texts(tokenizer: Any) -> dict[int, str]:
    """The tokenizer's added tokens (special or not, as vLLM counts them): id -> text."""
    return {token_id: added.content for token_id, added in tokenizer.added_tokens_decoder.items()}


def _plain_rust_tokenizer(tokenizer: Any) -> Any:
    """The Rust tokenizer behind a plain HF fast tokenizer (HF's `decode` adds nothing to it), or None."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    cls = type(tokenizer)
    plain = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
    return tokenizer._tokenizer if plain else None

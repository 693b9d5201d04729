"""vLLM's `bad_words`: the token sequences a request's words become, and the token each forbids next.

A word is tokenized as written (leading whitespace dropped) and, when the tokenizer marks word starts,
once more after a space, so that it is banned both at the start of the text and inside it. The spaced form
counts only when it starts with a different token and has as many tokens as the plain one (vLLM's rule; a
space that merely adds a token of its own would ban that space everywhere). A sequence's last token is
forbidden whenever the tokens before it end the request's generated tokens (the prompt does not count);
a one-token word is therefore always forbidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.sampling_params import MAX_BAD_WORDS

BadWordIds = tuple[tuple[int, ...], ...]

# vLLM's bounds (its GPU model runner's): token sequences per request after tokenization, and their tokens
# in all. Each step matches every sequence on the host, so the bounds also keep one request from slowing
# every other's steps.
MAX_BAD_WORDS_TOKENS = 1024


def bad_word_token_ids(words: Sequence[str], tokenizer: Any, vocab_size: int) -> BadWordIds:
    """The token sequences of `words` (see the module's docstring); refuses ids the model cannot draw."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            raise InvalidParamError(f"bad_words: {word!r} encodes to no tokens", "bad_words")
        sequences.append(plain)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    if len(sequences) > MAX_BAD_WORDS or sum(map(len, sequences)) > MAX_BAD_WORDS_TOKENS:
        raise InvalidParamError(f"bad_words: {len(sequences)} token sequences of {sum(map(len, sequences))} tokens "
                                f"after tokenization (with and without a leading space); at most {MAX_BAD_WORDS} "
                                f"sequences of {MAX_BAD_WORDS_TOKENS} tokens in all", "bad_words")
    outside = sorted({t for seq in sequences for t in seq if not 0 <= t < vocab_size})
    if outside:
        raise InvalidParamError(f"bad_words: token id(s) {outside[:5]} are outside the model's vocabulary "
                                f"[0, {vocab_size})", "bad_words")
    return tuple(sequences)


def reads_output(sequences: BadWordIds) -> bool:
    """Whether a ban depends on the generated tokens (a word of two or more tokens)."""
    return any(len(seq) > 1 for seq in sequences)


def banned_next(sequences: BadWordIds, output: Sequence[int]) -> list[int]:
    """The tokens `sequences` forbid after the generated tokens `output`."""
    banned = []
    for seq in sequences:
        prefix = len(seq) - 1
        if prefix == 0 or (prefix <= len(output) and tuple(output[len(output) - prefix:]) == seq[:-1]):
            banned.append(seq[-1])
    return banned

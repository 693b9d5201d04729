"""How pairs of texts score on the pooling runner (vLLM's `LLM.score`, and the server's /score and /rerank): the two
sides' pairing rule, a cross-encoder's prompt for a pair, a bi-encoder's cosine of two embeddings, and the tokens vLLM
counts for a pair. No torch: the API process uses it too.

vLLM's rules. The sides pair 1 to 1, 1 to N (the one first text against every second text) or N to N (index by index).
On a classifier (a cross-encoder) each pair is one prompt, the tokenizer's pair encoding of the two texts with its
special tokens, cut by the tokenizer's own truncation (the longer text first) to `truncate_prompt_tokens`. On an
embedding model (a bi-encoder) each text is embedded alone and a pair scores the cosine similarity of its two
embeddings; the pair's tokens are the first text's, the tokenizer's pad token (when it has one: vLLM joins them with
it) and the second text's.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.prompt_truncation import kept_tokens

_T = TypeVar("_T")


def check_pairing(first: tuple[str, int], second: tuple[str, int]) -> None:
    """vLLM's pairing rule on (name, count) of each side: neither empty, and 1 to 1, 1 to N or N to N
    (InvalidParamError naming the side at fault: a 400 on the server)."""
    for name, count in (first, second):
        if not count:
            raise InvalidParamError(f"{name} must not be empty: give at least one text", param=name)
    (name_1, count_1), (name_2, count_2) = first, second
    if count_1 > 1 and count_1 != count_2:
        raise InvalidParamError(f"{name_1} has {count_1} texts and {name_2} {count_2}: the sides pair 1 to 1, 1 to N "
                                "or N to N", param=name_2)


def pairs(first: list[_T], second: list[_T]) -> list[tuple[_T, _T]]:
    """The pairs of checked sides, in order: 1 to N repeats the one first item."""
    return list(zip(first * len(second) if len(first) == 1 else first, second, strict=True))


def pair_encoding(tokenizer: Any, text: str, pair: str, keep: int | None, max_model_len: int) -> list[int]:
    """A cross-encoder's prompt: the tokenizer's pair encoding of (`text`, `pair`) with its special tokens; `keep`
    (truncate_prompt_tokens, -1: the context length) cuts it as the tokenizer's own truncation does, as vLLM's
    `max_length`."""
    options: dict[str, Any] = {}
    if keep is not None:
        options = {"truncation": True, "max_length": kept_tokens(keep, max_model_len)}
    return list(tokenizer(text, text_pair=pair, add_special_tokens=True, **options)["input_ids"])


def cosine_scores(first: list[list[float]], second: list[list[float]]) -> list[float]:
    """The cosine similarity of each pair, `first` having one vector (scored against each of `second`) or as many as
    `second`; a zero vector scores 0 (torch's cosine_similarity clamps its norm too). Clipped to [-1, 1]: rounding
    put a text against itself at 1.0000000000000002, outside the range a client may check."""
    a = np.asarray(first, dtype=np.float64)
    b = np.asarray(second, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(a, axis=1), 1e-8) * np.maximum(np.linalg.norm(b, axis=1), 1e-8)
    return np.clip((a * b).sum(axis=1) / norms, -1.0, 1.0).tolist()


def pair_token_ids(first: list[int], second: list[int], pad_token_id: int | None) -> list[int]:
    """A bi-encoder pair's tokens as vLLM reports them: the two texts' tokens, the pad token between them when the
    tokenizer has one."""
    return first + ([] if pad_token_id is None else [pad_token_id]) + second


def pair_tokens(first: list[int], second: list[int], pad_token_id: int | None) -> int:
    """A request's usage as vLLM counts it: `pair_token_ids`' length summed over the pairs (in 1 to N the one first
    text counts once per pair). `first` and `second`: each text's token count."""
    pad = 0 if pad_token_id is None else 1
    return sum(a + pad + b for a, b in pairs(first, second))

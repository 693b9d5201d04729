"""Pooling prompts before any model work: the checks each prompt passes and the batches they travel in.

Standard library only: the API process checks prompts and cuts them into engine calls with these, and it never
imports torch (the engine core runs the pooling pass itself, in embed.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from flotilla.engine.errors import InvalidParamError

# Why a server of the generate runner answers /v1/embeddings with a 400 (its front end says so before any work).
GENERATE_RUNNER_REFUSAL = ("this server runs the generate runner; start it with --runner pooling (or --task embed) to "
                           "serve embeddings")


def check_prompt(index: int, ids: list[int], max_len: int, vocab: int, param: str = "input") -> None:
    """Non-empty, at most the context length (nothing is generated after it), ids in the vocabulary; errors name
    the request field `param` (/score's `text_2`, /rerank's `documents`) and the index in it."""
    if not ids:
        raise InvalidParamError(f"{param} {index} is empty", param=param)
    if len(ids) > max_len:
        raise InvalidParamError(f"This model's maximum context length is {max_len} tokens. However, {param} {index} "
                                f"has {len(ids)} tokens. Please reduce the length of the input.", param=param)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidParamError(f"{param} {index}: token id(s) {bad[:5]} are outside the vocabulary (size {vocab})",
                                param=param)


def prompt_batches(prompts: list[list[int]], max_tokens: int, max_prompts: int | None = None,
                   ) -> Iterator[list[list[int]]]:
    """Consecutive prompts, in order, of at most `max_tokens` tokens and `max_prompts` prompts together (one
    prompt at least, however long)."""
    batch: list[list[int]] = []
    tokens = 0
    for ids in prompts:
        if batch and (tokens + len(ids) > max_tokens or len(batch) == max_prompts):
            yield batch
            batch, tokens = [], 0
        batch.append(ids)
        tokens += len(ids)
    if batch:
        yield batch

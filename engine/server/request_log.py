"""Per-request log lines (`--enable-log-requests`, as vLLM's request logging): at INFO, one when a generation or
embedding request reaches the engine (its id, parameters and adapter) and one when it ends (finished, failed, or
aborted when its client went away or the server drained); at DEBUG (VLLM_LOGGING_LEVEL=DEBUG) its prompt text and
token ids too, as vLLM logs prompt inputs only at DEBUG. Off by default, as in vLLM: prompts can hold what logs
should not."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams

logger = logging.getLogger("flotilla.serve.requests")


def log_received(request_id: str, params: Any, lora_name: str | None, prompt_text: str | None,
                 prompt_ids: list[int] | list[list[int]], max_log_len: int | None = None) -> None:
    """A request's arrival: its id, parameters and adapter at INFO; its prompt(s) at DEBUG only, each cut to its
    first `max_log_len` characters and token ids (--max-log-len, as vLLM's)."""
    logger.info("Received request %s: params: %s, lora_request: %s.", request_id, params, lora_name)
    if max_log_len is not None:
        prompt_text = None if prompt_text is None else prompt_text[:max_log_len]
        prompt_ids = _cut(prompt_ids, max_log_len)
    logger.debug("Request %s prompt: %r, prompt_token_ids: %s.", request_id, prompt_text, prompt_ids)


def _cut(prompt_ids: list[int] | list[list[int]], n: int) -> list[int] | list[list[int]]:
    """A prompt's first `n` token ids, or each prompt's of a batch (embeddings)."""
    if prompt_ids and isinstance(prompt_ids[0], list):
        return [ids[:n] for ids in prompt_ids]
    return prompt_ids[:n]


def log_finished(request_id: str) -> None:
    """A request's normal end."""
    logger.info("Finished request %s.", request_id)


def log_failed(request_id: str, exc: BaseException) -> None:
    """A request refused or failed after it was received (the client got an error)."""
    logger.info("Request %s failed: %s", request_id, exc)


def log_aborted(request_id: str) -> None:
    """A request ended before its end: its client went away, or the server drained."""
    logger.info("Aborted request %s.", request_id)


async def logged(stream: AsyncGenerator[RequestOutput], request_id: str, prompt_ids: Sequence[int],
                 prompt_text: str | None, params: SamplingParams,
                 lora: LoRARequest | None, max_log_len: int | None = None) -> AsyncGenerator[RequestOutput]:
    """`stream` (an engine request's outputs), logging its arrival and its end (finished, failed or aborted);
    closing it closes `stream`, which aborts the request, as closing `stream` itself would."""
    log_received(request_id, params, lora.lora_name if lora is not None else None, prompt_text, list(prompt_ids),
                 max_log_len)
    finished = failed = False
    try:
        async for output in stream:
            finished = output.finished
            yield output
    except Exception as exc:
        failed = True
        log_failed(request_id, exc)
        raise
    finally:
        await stream.aclose()
        if finished:
            log_finished(request_id)
        elif not failed:
            log_aborted(request_id)

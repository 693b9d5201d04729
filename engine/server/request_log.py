"""Per-request log lines (`--enable-log-requests`, as vLLM's request logging): at INFO, one when a generation request
reaches the engine (its id, sampling parameters and adapter) and one when it ends (finished, failed, or aborted when
its client went away or the server drained); at DEBUG (VLLM_LOGGING_LEVEL=DEBUG) its prompt text and token ids too,
as vLLM logs prompt inputs only at DEBUG. Off by default, as in vLLM: prompts can hold what logs should not."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence

from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams

logger = logging.getLogger("flotilla.serve.requests")


async def logged(stream: AsyncGenerator[RequestOutput], request_id: str, prompt_ids: Sequence[int],
                 prompt_text: str | None, params: SamplingParams,
                 lora: LoRARequest | None) -> AsyncGenerator[RequestOutput]:
    """`stream` (an engine request's outputs), logging its arrival and its end (finished, refused or aborted);
    closing it closes `stream`, which aborts the request, as closing `stream` itself would."""
    logger.info("Received request %s: params: %s, lora_request: %s.", request_id, params,
                lora.lora_name if lora is not None else None)
    logger.debug("Request %s prompt: %r, prompt_token_ids: %s.", request_id, prompt_text, list(prompt_ids))
    end = "Aborted request %s."
    try:
        async for output in stream:
            if output.finished:
                end = "Finished request %s."
            yield output
    except Exception as exc:
        end = f"Request %s failed: {exc}"
        raise
    finally:
        await stream.aclose()
        logger.info(end, request_id)

"""Per-request log lines (`--enable-log-requests`, as vLLM's request logger): one when a generation request
reaches the engine, with its prompt and sampling parameters, and one when it ends (finished, or aborted when its
client went away or the server drained). Off by default, as in vLLM: prompts can hold what logs should not."""

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
    logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s, lora_request: %s.",
                request_id, prompt_text, params, list(prompt_ids), lora.lora_name if lora is not None else None)
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

"""vLLM's per-request extras that change what the server does, beyond sampling: prompt truncation,
the client's request id, how logprob tokens are labelled, and what the engine gets besides the prompt
(priority, cache salt)."""

from __future__ import annotations

import uuid
from typing import Any

from flotilla.engine.server.errors import APIError

# Bounds on the extras (vLLM leaves them open): a priority is a 32-bit integer, as Kubernetes'
# PriorityClass values; a salt is a short key, not a payload the server hashes and keeps per block.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
CACHE_SALT_MAX_CHARS = 256


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """The last `keep` tokens of a prompt (vLLM's `truncate_prompt_tokens`: the start is cut, so the
    end the model continues from stays); -1 keeps up to `max_model_len`, None keeps everything."""
    if keep is None:
        return token_ids
    if keep == -1:
        keep = max_model_len
    if keep == 0:
        raise APIError(400, "truncate_prompt_tokens must be at least 1, or -1 for the model's maximum context "
                            "length", param="truncate_prompt_tokens")
    if keep > max_model_len:
        raise APIError(400, f"truncate_prompt_tokens={keep} is larger than this model's maximum context length "
                            f"({max_model_len} tokens)", param="truncate_prompt_tokens")
    return token_ids[-keep:]


def response_ids(prefix: str, request_id: str | None) -> tuple[str, str]:
    """(the response's `id`, the engine's request id): `<prefix>-<request_id>` as vLLM echoes a
    client's `request_id`, or a random one. The engine id always gets a random part, so two clients
    that send the same `request_id` at once do not collide inside the engine."""
    random_part = uuid.uuid4().hex
    public = f"{prefix}-{request_id if request_id is not None else random_part}"
    return public, public if request_id is None else f"{public}-{random_part[:8]}"


def token_label(tokenizer: Any, token: int, as_token_ids: bool) -> str:
    """A token as logprobs name it: its text, or `token_id:<id>` (vLLM's `return_tokens_as_token_ids`,
    for clients that need ids where single tokens do not decode to valid text)."""
    return f"token_id:{token}" if as_token_ids else tokenizer.decode([token])


def engine_kwargs(priority: int, cache_salt: str | None) -> dict[str, Any]:
    """What `AsyncEngine.generate` takes besides the prompt and sampling parameters."""
    return {"priority": priority, "cache_salt": cache_salt}

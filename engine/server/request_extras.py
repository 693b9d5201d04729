"""vLLM's per-request extras that change what the server does, beyond sampling: the client's request id,
how logprob tokens are labelled, and what the engine gets besides the prompt (priority, cache salt).
Prompt truncation is engine/prompt_truncation.py (the offline API has it too)."""

from __future__ import annotations

import uuid
from typing import Any

# Bounds on the extras (vLLM leaves them open): a priority is a 32-bit integer, as Kubernetes'
# PriorityClass values.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
# vLLM checks only that a cache_salt is a non-empty string. The bound here is far past any salt a client or gateway
# derives (vLLM's docs suggest 43 base64 characters, 256 bits; a hex SHA-512 is 128, a signed token a few hundred to
# ~2,000), so a salt vLLM takes is taken here, while a request still cannot make the engine keep and hash (once, into
# its first block's key: no block stores it) a body-sized string beside its prompt: a salt is a key, not a payload.
CACHE_SALT_MAX_CHARS = 4096


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

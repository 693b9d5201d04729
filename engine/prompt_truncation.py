"""vLLM's `truncate_prompt_tokens`: keep a prompt's last N tokens (the start is cut, so the end the model
continues from stays), for the offline API and the server alike; or, with vLLM's pooling `truncation_side`
"right", its first N."""

from __future__ import annotations

from typing import Literal

from flotilla.engine.errors import InvalidParamError


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int,
                    side: Literal["left", "right"] = "left") -> list[int]:
    """The last `keep` tokens of a prompt (the first with `side` "right": the right side is cut); -1 keeps up to
    `max_model_len`, None keeps everything.

    0 and a `keep` over the context length are refused (InvalidParamError on `truncate_prompt_tokens`:
    a 400 on the server), as vLLM's `_validate_truncation_size` refuses the latter."""
    if keep is None:
        return token_ids
    if keep == -1:
        keep = max_model_len
    if keep == 0:
        raise InvalidParamError("truncate_prompt_tokens must be at least 1, or -1 for the model's maximum "
                                "context length", param="truncate_prompt_tokens")
    if keep > max_model_len:
        raise InvalidParamError(f"truncate_prompt_tokens={keep} is larger than this model's maximum context "
                                f"length ({max_model_len} tokens)", param="truncate_prompt_tokens")
    return token_ids[:keep] if side == "right" else token_ids[-keep:]

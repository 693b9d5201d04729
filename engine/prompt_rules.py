"""The rules a generate request's prompt meets, stated once: the engine applies them when it queues a request, the
server to every prompt of a multi-prompt completions request before it submits any (so one bad prompt refuses the
request with nothing run). Embedding inputs have their own (`pooling/prompts.check_prompt`: nothing is generated
after them, so a prompt may fill the context)."""

from __future__ import annotations

from flotilla.engine.errors import InvalidParamError


def check_prompt(token_ids: list[int], max_model_len: int, vocab_size: int) -> None:
    """Every rule below, in the engine's order (InvalidParamError on `prompt`)."""
    check_prompt_length(token_ids, max_model_len)
    check_prompt_ids(token_ids, vocab_size)


def check_prompt_length(token_ids: list[int], max_model_len: int) -> None:
    """Not empty, and room for at least one generated token."""
    if not token_ids:
        raise InvalidParamError("the prompt is empty", "prompt")
    if len(token_ids) >= max_model_len:
        # vLLM's words (the prompt must leave room for one generated token): clients match them
        raise InvalidParamError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{len(token_ids)} input tokens. Please reduce the length of the input messages.",
            "prompt",
        )


def check_prompt_ids(token_ids: list[int], vocab_size: int) -> None:
    """Every id lies in [0, vocab_size): the model's logits are that wide. An empty list passes (the engine checks
    only the ids past a cached prefix, which may be none)."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):  # two C loops: the common case
        return
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    raise InvalidParamError(f"prompt token id(s) {bad[:5]} are outside the vocabulary (size {vocab_size})", "prompt")

"""What one embedding request asks of the pooler, checked against what the model allows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from flotilla.engine.errors import InvalidParamError


class PoolingParams(BaseModel):
    """`dimensions`: keep the first N of the pooled vector (matryoshka models only); `normalize`: L2."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dimensions: int | None = None
    normalize: bool = True


def matryoshka_dimensions(hf_config: dict[str, Any]) -> list[int] | None:
    """The sizes a matryoshka model was trained for ([] = any size); None when it is not one.

    As vLLM: config.json's `is_matryoshka: true`, or a `matryoshka_dimensions` list.
    """
    listed = hf_config.get("matryoshka_dimensions")
    if listed is not None:
        return [int(d) for d in listed]
    return [] if hf_config.get("is_matryoshka") else None


def matryoshka_problem(hf_config: dict[str, Any]) -> str | None:
    """Why config.json's (or --hf-overrides') `matryoshka_dimensions` cannot be read, or None: a request asking for
    `dimensions` on such a model was a 500 (`'int' object is not iterable`), and a string was read digit by digit."""
    listed = hf_config.get("matryoshka_dimensions")
    if listed is None or (isinstance(listed, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                           for d in listed)):
        return None
    return f"matryoshka_dimensions must be a list of positive integers (config.json or --hf-overrides), not {listed!r}"


def check_dimensions(params: PoolingParams, hf_config: dict[str, Any]) -> None:
    """Refuse a `dimensions` the model does not allow (InvalidParamError -> 400 on the server)."""
    dims = params.dimensions
    if dims is None:
        return
    allowed = matryoshka_dimensions(hf_config)
    if allowed is None:
        raise InvalidParamError(
            "this model does not support matryoshka representation (config.json has neither is_matryoshka "
            "nor matryoshka_dimensions): changing the output dimensions would give poor embeddings",
            param="dimensions")
    if dims < 1:
        raise InvalidParamError(f"dimensions must be at least 1, got {dims}", param="dimensions")
    if allowed and dims not in allowed:
        raise InvalidParamError(f"this model supports only dimensions {allowed}, got {dims}", param="dimensions")
    hidden = int(hf_config["hidden_size"])
    if dims > hidden:
        raise InvalidParamError(f"dimensions must be at most the hidden size {hidden}, got {dims}",
                                param="dimensions")

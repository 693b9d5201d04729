"""Per-request sampling parameters, with vLLM's names and meanings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SamplingParams(BaseModel):
    """How to pick each next token and when to stop.

    `temperature=0` is greedy decoding. `max_tokens=None` means "until EOS or max_model_len".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    max_tokens: int | None = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    skip_special_tokens: bool = True

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(_readable(exc)) from None

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.n > 1:
            raise ValueError("n > 1 is not implemented yet")
        return self

    @property
    def greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature == 0.0


def _readable(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        name = ".".join(str(x) for x in err["loc"]) or "SamplingParams"
        parts.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
    return "invalid sampling parameters: " + "; ".join(parts)

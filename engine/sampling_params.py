"""Per-request sampling parameters, with vLLM's names, defaults and meanings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# vLLM caps the number of logprobs a request may ask for (--max-logprobs, default 20).
MAX_LOGPROBS = 20


class SamplingParams(BaseModel):
    """How to pick each next token and when to stop.

    - `temperature=0` is greedy decoding; `top_k` (0 or -1 = off), `top_p` and `min_p` truncate the
      distribution before drawing; `seed` makes a request's draws reproducible whatever else runs.
    - `presence_penalty` / `frequency_penalty` subtract from the logits of tokens already generated
      (once, or once per occurrence); `repetition_penalty` divides positive and multiplies negative
      logits of tokens in the prompt or the output (1 = off); `logit_bias` adds to given token ids.
    - Stops: EOS (unless `ignore_eos`), `stop_token_ids`, `stop` strings (cut from the text unless
      `include_stop_str_in_output`), `max_tokens`; none before `min_tokens` tokens.
    - `n` completions share the prompt's KV blocks; `logprobs` returns the top-N log-probabilities
      per generated token, `prompt_logprobs` per prompt token.
    - `output_kind` as vLLM's: every step, or only the final output.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    logit_bias: dict[int, float] | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    skip_special_tokens: bool = True
    # "cumulative": an output every step (streaming); "final_only": one output when the request ends,
    # which spares per-token detokenization when no stop string needs it (the offline LLM uses it).
    output_kind: Literal["cumulative", "final_only"] = "cumulative"

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(_readable(exc)) from None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: object) -> object:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        for token, bias in (value or {}).items():
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias for token {token} is {bias}; it must lie in [-100, 100]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must not be empty")
        return self

    @property
    def greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        """True when any presence, frequency or repetition penalty applies."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _readable(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        name = ".".join(str(x) for x in err["loc"]) or "SamplingParams"
        parts.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
    return "invalid sampling parameters: " + "; ".join(parts)

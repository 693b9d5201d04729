"""`--speculative-config`: vLLM's JSON keys, validated into one frozen component."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flotilla.engine.json_flag import parse_json_flag

# vLLM's default window when neither prompt_lookup bound is given.
DEFAULT_PROMPT_LOOKUP = 5


class SpeculativeConfig(BaseModel):
    """Speculative decoding, as `vllm serve --speculative-config` takes it.

    `method` is "ngram" (prompt lookup: the tokens that followed the latest earlier occurrence of the
    sequence's last n tokens) or "draft_model" (a smaller model with the same tokenizer, `model`).
    Above `disable_by_batch_size` running requests a step does not speculate (vLLM's load rule).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ngram", "draft_model"]
    num_speculative_tokens: int = Field(gt=0, le=32)
    prompt_lookup_max: int | None = Field(None, gt=0)
    prompt_lookup_min: int | None = Field(None, gt=0)
    model: str | None = None
    disable_by_batch_size: int | None = Field(None, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _infer_method(cls, data: Any) -> Any:
        # As vLLM: a draft model given without a method means the draft-model proposer.
        if isinstance(data, dict) and "method" not in data and data.get("model"):
            return {**data, "method": "draft_model"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.model:
            raise ValueError('method "draft_model" needs "model" (the draft model\'s directory)')
        if self.method == "ngram":
            if self.model:
                raise ValueError('method "ngram" takes no "model"')
            lo, hi = self.lookup_window
            if lo > hi:
                raise ValueError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        return self

    @property
    def lookup_window(self) -> tuple[int, int]:
        """(min, max) n-gram length, filled in as vLLM does when one or both are absent."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            return DEFAULT_PROMPT_LOOKUP, DEFAULT_PROMPT_LOOKUP
        return (lo if lo is not None else hi or 1), (hi if hi is not None else lo or 1)


def parse_speculative_config(value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
    """The flag's value (JSON text, or a dict from the Python API) as a config; errors name the flag."""
    if value is None:
        return None
    return parse_json_flag(value, "--speculative-config", SpeculativeConfig)

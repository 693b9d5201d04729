"""Per-request sampling parameters, with vLLM's names, defaults and meanings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.structured_output.params import StructuredOutputsParams
from flotilla.validation_messages import describe

# vLLM's bound on a request's bad words after tokenization (engine/bad_words.py checks it there too).
MAX_BAD_WORDS = 128
# OpenAI's range for a logit bias (the server clamps a request's to it, as vLLM's does).
LOGIT_BIAS_MAX = 100.0
# Stop strings are searched for in every completion's new text at every step, on the step loop: a request
# past these bounds would slow every stream (vLLM has none; TGI allows 4 by default, OpenAI 4).
MAX_STOP_STRINGS = 128
MAX_STOP_CHARS = 8192  # in all
# vLLM's --max-logprobs default: the most logprobs (or prompt_logprobs) a request may ask for (`check_logprobs`).
MAX_LOGPROBS = 20
# Seeds are signed 64-bit integers, as vLLM's API edge bounds them (torch.long's range).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# Below this temperature a draw is greedy (vLLM's _SAMPLING_EPS): dividing logits by a subnormal
# temperature overflows float32 and would turn the distribution into NaN.
GREEDY_TEMPERATURE = 1e-5
# vLLM's SamplingParams takes temperature in [0, 2] (the OpenAI range; PR vllm-project/vllm#44965, vLLM 0.24).
MAX_TEMPERATURE = 2.0
# repetition_penalty is any finite number above 0, as vLLM's. It divides (or multiplies) fp32 logits, where a
# penalty past these bounds makes a logit inf (or a subnormal penalty 0), and the row NaN: the sampler uses at most
# and at least these. Within them a penalised logit already ends at ~0 or tens of orders of magnitude from the
# others, so a draw from the bound is the draw from the penalty (HF and vLLM users stay within ~[0.5, 2]).
REPETITION_PENALTY_FLOOR, REPETITION_PENALTY_CEILING = 1e-20, 1e20


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
    - `output_kind` as vLLM's: every step (the whole output so far, or only what is new), or only the final output.
    - `structured_outputs` constrains the output to a JSON schema, regex, choice or EBNF grammar.
    - `allowed_token_ids` (vLLM's) restricts every draw to the given ids; `bad_words` (vLLM's) are words
      never to complete: a word's last token is banned whenever the tokens before it end the output so far
      (engine/bad_words.py tokenizes them with and without a leading space, as vLLM does).
    """

    # NaN and infinity are refused in every float field: no comparison bounds them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n: int = Field(1, ge=1, le=128)
    temperature: float = 1.0  # [0, 2]: `_temperature_range`
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # the upper bound is the vocabulary: `check_vocab`
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
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
    # -1 (vLLM's): every vocabulary entry (`with_whole_vocabulary`); the upper bound is --max-logprobs: `check_logprobs`
    logprobs: int | None = None  # >= -1: `_logprobs_count`
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # vLLM's: False writes an added token that follows another without the space some decoders put between them
    spaces_between_special_tokens: bool = True
    # "cumulative": an output every step with the whole output so far (copied: O(output length) a step);
    # "delta": an output every step with only its new text, token ids and logprobs (the server's streams);
    # "final_only": one output when the request ends, which spares per-token detokenization when no stop
    # string needs it (the offline LLM uses it).
    output_kind: Literal["cumulative", "delta", "final_only"] = "cumulative"
    structured_outputs: StructuredOutputsParams | None = None
    allowed_token_ids: list[int] | None = None  # ids bounded by the vocabulary: `check_vocab`
    bad_words: list[str] | None = None
    # vLLM's: keep the prompt's last N tokens (-1: the context length); LLMEngine.add_request cuts it.
    truncate_prompt_tokens: int | None = Field(None, ge=-1)

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidParamError(_readable(exc), _first_field(exc)) from None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: object) -> object:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _stops_bounded(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):  # here, not in a model validator, so that the 400 names `stop`
            raise ValueError("stop strings must not be empty")
        if len(value) > MAX_STOP_STRINGS or sum(map(len, value)) > MAX_STOP_CHARS:
            raise ValueError(f"stop holds {len(value)} strings of {sum(map(len, value))} characters in all; at most "
                             f"{MAX_STOP_STRINGS} strings of {MAX_STOP_CHARS} characters")
        return value

    @field_validator("temperature")
    @classmethod
    def _temperature_range(cls, value: float) -> float:
        # vLLM's wording, so clients that match its refusal read ours alike
        if value < 0:
            raise ValueError(f"temperature must be non-negative, got {value}.")
        if value > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {value}.")
        return value

    @field_validator("logprobs", "prompt_logprobs")
    @classmethod
    def _logprobs_count(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < -1:  # vLLM's wording
            raise ValueError(f"{info.field_name} must be non-negative or -1, got {value}.")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        for token, bias in (value or {}).items():
            if not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
                raise ValueError(f"logit_bias for token {token} is {bias}; it must lie in [-100, 100]")
        return value

    @field_validator("allowed_token_ids")
    @classmethod
    def _some_allowed(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("allowed_token_ids must not be empty: leave it out (null) to allow every token")
        return value

    @field_validator("bad_words")
    @classmethod
    def _words_with_text(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(value) > MAX_BAD_WORDS:  # each word gives one token sequence or two
            raise ValueError(f"bad_words holds {len(value)} words; at most {MAX_BAD_WORDS}")
        for i, word in enumerate(value or ()):
            if not word.strip():
                # vLLM tokenizes the word without its leading whitespace: nothing would be left to ban.
                raise ValueError(f"bad_words[{i}] is empty or only whitespace; every bad word needs text")
        return value

    @field_validator("min_tokens")
    @classmethod
    def _min_within_max(cls, value: int, info: ValidationInfo) -> int:
        # Here, not in a model validator, so that the 400 names `min_tokens` (max_tokens, declared before it, is
        # already in `info.data` unless it failed its own check). vLLM's condition and words.
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and value > max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {value}.")
        return value

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse token ids and a top_k that the model's vocabulary cannot hold (vLLM's engine-side
        checks); the sampler indexes its `[B, vocab]` logits with them."""
        if self.top_k > vocab_size:
            raise InvalidParamError(f"top_k ({self.top_k}) must be at most the vocabulary size ({vocab_size}); "
                                    "-1 or 0 turns it off", "top_k")
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", list(self.logit_bias or ())),
                          ("allowed_token_ids", self.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise InvalidParamError(f"{name}: token id(s) {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                                        name)

    def with_whole_vocabulary(self, vocab_size: int) -> SamplingParams:
        """These params with logprobs / prompt_logprobs -1 (vLLM's: every vocabulary entry) as `vocab_size`, the
        count that --max-logprobs then bounds (`check_logprobs`) and the sampler ranks; self when neither is -1."""
        update = {name: vocab_size for name in ("logprobs", "prompt_logprobs") if getattr(self, name) == -1}
        return self.model_copy(update=update) if update else self

    def check_logprobs(self, max_logprobs: int) -> None:
        """Refuse more logprobs or prompt_logprobs than `max_logprobs` (--max-logprobs, its -1 resolved to the
        vocabulary size: ModelConfig.logprobs_cap), in vLLM's words."""
        for param, kind, asked in (("logprobs", "sample", self.logprobs),
                                   ("prompt_logprobs", "prompt", self.prompt_logprobs)):
            if asked is not None and asked > max_logprobs:
                raise InvalidParamError(f"Requested {kind} logprobs of {asked}, which is greater than max allowed: "
                                        f"{max_logprobs}", param)

    @property
    def has_token_masks(self) -> bool:
        """True when `allowed_token_ids` or `bad_words` forbid tokens (the sampler's masks, not argmax)."""
        return self.allowed_token_ids is not None or bool(self.bad_words)

    @property
    def has_penalties(self) -> bool:
        """True when any presence, frequency or repetition penalty applies."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _first_field(exc: ValidationError) -> str | None:
    """The top-level field of the first error (None for a cross-field rule)."""
    for err in exc.errors():
        if err["loc"]:
            return str(err["loc"][0])
    return None


def _readable(exc: ValidationError) -> str:
    where = lambda loc: ".".join(str(x) for x in loc) or "SamplingParams"  # noqa: E731
    return "invalid sampling parameters: " + "; ".join(describe(exc.errors(), where))

"""A request's state as it moves through the engine: tokens, progress and KV blocks."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flotilla.engine.bad_words import reads_output
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from flotilla.engine.structured_output.matcher import RequestGrammar

_U64 = (1 << 64) - 1
_NEVER = 1 << 62  # an output token index no request reaches


class RequestStatus(enum.Enum):
    """Where a request is in its life cycle."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    finished: bool  # True for the three terminal states

    def __init__(self, value: str) -> None:
        # A plain attribute, not a property: the step loop reads it several times per request per
        # step, and a property on an enum member costs ~15x an attribute read.
        self.finished = value in ("stop", "length", "abort")


@dataclass(slots=True)
class SentCounts:
    """How much of a completion its delta outputs have carried: characters of text, token ids, logprob entries."""

    chars: int = 0
    tokens: int = 0
    logprobs: int = 0


@dataclass(eq=False)
class Request:
    """One generation request.

    `num_computed_tokens` counts the tokens whose K/V are in the cache or being computed by a step
    already scheduled (it advances when a step is planned). `num_pending` counts output tokens drawn by
    a step in flight whose ids the host does not know yet (asynchronous scheduling: 0 or 1; always 0
    between synchronous steps). Prefill, chunked prefill,
    decode and recompute after preemption are all the same thing: feed the tokens from
    `num_computed_tokens` up to (at most) the end of prompt-then-output; when the end is reached, the
    step produces the next token.

    A request with `n > 1` is `n` of these, one per completion (`index`), sharing `parent_id`. Only
    the first is scheduled at first; it carries the others in `fork_children`, and the step that
    finishes its prompt draws every child's first token and forks its block table to them.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    # The tokenizer's EOS: stopping on it leaves stop_reason None; on the other eos_token_ids (generation_config's
    # list), stop_reason is the id, as vLLM makes those stop token ids.
    eos_token_id: int | None = None
    prompt: str | None = None
    # Lower values are scheduled first under `--scheduling-policy priority` (vLLM's meaning).
    priority: int = 0
    # Mixed into the first KV block's prefix-cache hash: only requests with the same salt share blocks.
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # Prompt tokens found in the prefix cache when first scheduled (-1 until then): usage's cached_tokens.
    num_cached_tokens: int = -1
    num_pending: int = 0
    num_preemptions: int = 0  # times its blocks were taken back (it resumes in others, recomputed)
    # Only ever appended to: any other change (trim, free, copy-on-write) makes a new list, so that a list seen
    # before holds the same ids in its first entries (the CUDA-graph staging writes only a table's new ids).
    block_ids: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None
    parent_id: str = ""
    index: int = 0
    fork_children: list[Request] = field(default_factory=list)
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model
    # Per generated token: {token id: (logprob, rank)} for the drawn token and the top-N.
    logprobs: list[dict[int, tuple[float, int]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    # What this completion's delta outputs (output_kind "delta") have carried so far.
    sent: SentCounts = field(default_factory=SentCounts, repr=False)
    # Per prompt token (None for the first): as `logprobs`, filled while the prompt is computed.
    prompt_logprobs: list[dict[int, tuple[float, int]] | None] = field(default_factory=list)
    # Structured output: this completion's grammar state (None = unconstrained).
    grammar: RequestGrammar | None = None
    # `sampling_params.bad_words` as token sequences (engine/bad_words.py), tokenized once when added.
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # Sampler inputs built from `sampling_params` at the first draw and reused (sampling_metadata): `[V]` rows of
    # the `allowed_token_ids` mask, the dense `logit_bias`, the ids banned until `min_tokens`; one dict shared by a
    # request's n completions, so a step stacks each row once for all n. A step's cost then grows neither with the
    # lists' lengths nor with n (a whole-vocabulary bias or stop id list was a Python loop per completion per step,
    # then n x its length in (row, token) pairs gathered every step).
    sampler_tensors: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict, repr=False)
    # `sampling_params.stop_token_ids` as a set (made here unless given), for the per-step stop check.
    stop_token_set: frozenset[int] = field(default=frozenset(), repr=False)
    # Made here from `sampling_params` and `bad_words_token_ids`, read for every running request every step (a
    # per-row test of the parameters costs a step at 512 rows ~0.2 ms each, for features no row may use):
    # the output token index from which a draw is a plain argmax (`model_runner._plain_greedy`; _NEVER if never),
    # and whether planning the next step needs this request's known output (penalties, bad words of 2+ tokens).
    argmax_from: int = field(default=0, init=False, repr=False)
    reads_known_outputs: bool = field(default=False, init=False, repr=False)

    # Timings (time.monotonic()) for the latency metrics.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None

    def __post_init__(self) -> None:
        if not self.parent_id:
            self.parent_id = self.request_id
        p = self.sampling_params
        if not self.stop_token_set and p.stop_token_ids:
            self.stop_token_set = frozenset(p.stop_token_ids)
        # Greedy with nothing that changes logits or asks for them; `min_tokens` bans stop ids and EOS until reached,
        # which bans nothing with ignore_eos and no stop ids (benchmark clients send it so).
        argmax = (p.temperature == 0 and not p.has_penalties and not p.logit_bias and not p.has_token_masks
                  and p.logprobs is None)  # fmt: skip
        bans = not (p.ignore_eos and not p.stop_token_ids)
        self.argmax_from = (p.min_tokens if bans else 0) if argmax else _NEVER
        self.reads_known_outputs = p.has_penalties or reads_output(self.bad_words_token_ids)

    @property
    def sample_seed(self) -> int | None:
        """This completion's own random stream: completion i of a request seeded s draws as a lone request seeded
        s + i (vLLM's rule for n > 1: a completion is reproduced alone with its own seed)."""
        seed = self.sampling_params.seed
        if seed is None:
            return None
        # Wrapped to a signed 64-bit integer: the sampler carries it in an int64 tensor, and any
        # seed the API accepts must fit (the hash mixes it with wrapping arithmetic anyway).
        mixed = ((seed + self.index) * 1_000_003) & _U64
        return mixed - (1 << 64) if mixed >> 63 else mixed

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens `start:end` of prompt-then-output, without concatenating the whole sequence."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish_reason: "stop", "length", "abort", or None while running."""
        return self.status.value if self.status.finished else None

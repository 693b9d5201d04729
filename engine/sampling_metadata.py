"""Build the sampler's per-row tensors from the requests that draw a token this step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flotilla.engine.bad_words import banned_next
from flotilla.engine.request import Request
from flotilla.engine.sampler import SamplingBatch
from flotilla.engine.sampling_params import (
    GREEDY_TEMPERATURE,
    REPETITION_PENALTY_CEILING,
    REPETITION_PENALTY_FLOOR,
)
from flotilla.engine.staging import device_tensor


@dataclass
class SamplingRow:
    """One token to draw: for `request`, from the logits at flattened index `logits_index`; it will be
    the request's output token number `output_index` (counted on the step's inputs, not on the
    request's known outputs, which may still lack the token of a step in flight)."""

    request: Request
    logits_index: int
    output_index: int


def build_sampling_batch(
    rows: list[SamplingRow],
    vocab_size: int,
    device: torch.device,
    generator: torch.Generator,
    logprobs_mode: str = "raw_logprobs",
) -> SamplingBatch:
    """Per-row parameters as tensors; requests without a seed get a fresh stream from `generator`.
    `logprobs_mode`: --logprobs-mode (what the rows' logprobs report)."""
    params = [r.request.sampling_params for r in rows]
    seeds, positions = _seeds_and_positions(rows, generator)
    sparse = _gather_sparse(rows, vocab_size, device)
    to = _DeviceLists(device, vocab_size)
    any_penalties = any(p.has_penalties for p in params)
    # The penalties read every token a row has seen; without any, the step copies none.
    seen = rows if any_penalties else []
    logprobs = [p.logprobs for p in params if p.logprobs is not None]
    penalties = [min(max(p.repetition_penalty, REPETITION_PENALTY_FLOOR), REPETITION_PENALTY_CEILING) for p in params]
    temperatures = [0.0 if p.temperature < GREEDY_TEMPERATURE else p.temperature for p in params]
    return SamplingBatch(
        temperature=to.tensor(temperatures, torch.float32),
        # Beyond the vocabulary top_k keeps every token: clamped so it always fits an int64 tensor.
        top_k=to.tensor([min(max(p.top_k, 0), vocab_size) for p in params], torch.long),
        top_p=to.tensor([p.top_p for p in params], torch.float32),
        min_p=to.tensor([p.min_p for p in params], torch.float32),
        seeds=to.tensor(seeds, torch.long),
        positions=to.tensor(positions, torch.long),
        presence_penalty=to.tensor([p.presence_penalty for p in params], torch.float32),
        frequency_penalty=to.tensor([p.frequency_penalty for p in params], torch.float32),
        repetition_penalty=to.tensor(penalties, torch.float32),
        output_tokens=to.padded([r.request.output_token_ids for r in seen], len(rows)),
        prompt_tokens=to.padded([r.request.prompt_token_ids for r in seen], len(rows)),
        bias_rows=to.rows_of([(i, t) for i, t, _ in sparse.bias]),
        bias_tokens=to.cat([t for _, t, _ in sparse.bias], torch.long),
        bias_values=to.cat([v for _, _, v in sparse.bias], torch.float32),
        banned_rows=to.rows_of(sparse.banned),
        banned_tokens=to.cat([t for _, t in sparse.banned], torch.long),
        restricted_rows=to.tensor(sparse.restricted_rows, torch.long),
        allowed_masks=to.stack_masks(sparse.allowed_masks),
        bad_rows=to.tensor(sparse.bad_rows, torch.long),
        bad_tokens=to.tensor(sparse.bad_tokens, torch.long),
        all_greedy=all(t == 0 for t in temperatures),
        any_penalties=any_penalties,
        any_truncation=any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params),
        max_logprobs=max(logprobs) if logprobs else None,
        logprobs_mode=logprobs_mode,
    )


def _seeds_and_positions(rows: list[SamplingRow], generator: torch.Generator) -> tuple[list[int], list[int]]:
    """Each row's random stream and its place in it: a seeded request's own seed at its output index (so a
    seeded completion repeats whatever the batch), else a fresh seed from `generator` at position 0."""
    # Drawn for every row, seeded or not: the generator advances by the batch size either way.
    fresh = torch.randint(0, 2**62, (len(rows),), generator=generator).tolist()
    seeds = [r.request.sample_seed if r.request.sample_seed is not None else fresh[i] for i, r in enumerate(rows)]
    positions = [r.output_index if r.request.sample_seed is not None else 0 for r in rows]
    return seeds, positions


@dataclass
class _SparseEntries:
    """The step's per-token constraints, gathered row by row: only the rows that ask for one add to it."""

    bias: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (row, token ids, values)
    banned: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (row, token ids banned until min_tokens)
    restricted_rows: list[int] = field(default_factory=list)  # rows with allowed_token_ids
    allowed_masks: list[torch.Tensor] = field(default_factory=list)  # their [vocab_size] masks, in that order
    bad_rows: list[int] = field(default_factory=list)  # (row, token) pairs a bad word forbids this step
    bad_tokens: list[int] = field(default_factory=list)


def _gather_sparse(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> _SparseEntries:
    """The logit bias, min_tokens bans, allowed-token masks and bad-word bans of the rows that have them."""
    sparse = _SparseEntries()
    for i, r in enumerate(rows):
        p = r.request.sampling_params
        if p.logit_bias:
            sparse.bias.append((i, *logit_bias_tensors(r.request, vocab_size, device)))
        if r.output_index < p.min_tokens:
            sparse.banned.append((i, min_tokens_bans(r.request, vocab_size, device)))
        if p.allowed_token_ids is not None:
            sparse.restricted_rows.append(i)
            sparse.allowed_masks.append(allowed_mask(r.request, vocab_size, device))
        if r.request.bad_words_token_ids:
            # The request's known output: a bad word of several tokens keeps it known each step
            # (LLMEngine._needs_known_outputs) and does not speculate (policy.request_can_speculate).
            bad = banned_next(r.request.bad_words_token_ids, r.request.output_token_ids)
            sparse.bad_rows += [i] * len(bad)
            sparse.bad_tokens += bad
    return sparse


class _DeviceLists:
    """Python lists and per-row parts as tensors on the step's device (`staging.device_tensor`)."""

    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.device = device
        self.vocab_size = vocab_size

    def tensor(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """`values` as one tensor."""
        return device_tensor(values, dtype, self.device)

    def padded(self, lists: list[list[int]], n: int) -> torch.Tensor:
        """`[n, width]` token ids padded with `vocab_size` (a column the penalties ignore); `[n, 0]` for no lists."""
        width = max((len(x) for x in lists), default=0)
        padded = [x + [self.vocab_size] * (width - len(x)) for x in lists]
        return self.tensor(padded, torch.long).reshape(n, width)

    def cat(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The parts end to end; an empty tensor of `dtype` for none."""
        return torch.cat(parts) if parts else self.tensor([], dtype)

    def rows_of(self, parts: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Each part's row index, once per entry of its tensor (the row side of (row, token) pairs)."""
        return self.cat([torch.full_like(t, i) for i, t in parts], torch.long)

    def stack_masks(self, masks: list[torch.Tensor]) -> torch.Tensor:
        """`[r, vocab_size]` bool: the restricted rows' masks; `[0, vocab_size]` for none."""
        if masks:
            return torch.stack(masks)
        return torch.ones(0, self.vocab_size, dtype=torch.bool, device=self.device)


def allowed_mask(request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The request's `allowed_token_ids` as a `[vocab_size]` bool row on `device`, built once per request."""

    def make() -> tuple[torch.Tensor, ...]:
        ids = request.sampling_params.allowed_token_ids
        assert ids is not None, "called for rows with allowed_token_ids only"
        mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        mask[device_tensor([t for t in ids if 0 <= t < vocab_size], torch.long, device)] = True
        return (mask,)

    return _cached(request, "allowed", device, make)[0]


def _cached(request: Request, key: str, device: torch.device,
            make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """`request.sampler_tensors[key]`, made by `make` the first time (or on another device)."""
    tensors = request.sampler_tensors.get(key)
    if tensors is None or tensors[0].device != device:
        tensors = request.sampler_tensors[key] = make()
    return tensors


def logit_bias_tensors(request: Request, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's `logit_bias` as (token ids, values) tensors on `device`, built once per request."""

    def make() -> tuple[torch.Tensor, ...]:
        bias = request.sampling_params.logit_bias or {}
        kept = [(t, v) for t, v in bias.items() if 0 <= t < vocab_size]  # the engine refuses others (check_vocab)
        return (device_tensor([t for t, _ in kept], torch.long, device),
                device_tensor([v for _, v in kept], torch.float32, device))

    tokens, values = _cached(request, "bias", device, make)
    return tokens, values


def min_tokens_bans(request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The ids a request may not draw before `min_tokens` (its stop ids, and EOS unless `ignore_eos`), as a
    tensor on `device`, built once per request."""

    def make() -> tuple[torch.Tensor, ...]:
        stops = request.stop_token_set | (frozenset() if request.sampling_params.ignore_eos else request.eos_token_ids)
        # The engine refuses ids outside the vocabulary; an EOS id of a padded config may still be.
        return (device_tensor(sorted(t for t in stops if 0 <= t < vocab_size), torch.long, device),)

    return _cached(request, "bans", device, make)[0]

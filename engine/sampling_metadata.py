"""Build the sampler's per-row tensors from the requests that draw a token this step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flotilla.engine.bad_words import banned_next
from flotilla.engine.request import Request
from flotilla.engine.sampler import SamplingBatch
from flotilla.engine.sampling_params import GREEDY_TEMPERATURE, TEMPERATURE_CEILING
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
    n = len(rows)
    fresh = torch.randint(0, 2**62, (n,), generator=generator).tolist()
    seeds = [r.request.sample_seed if r.request.sample_seed is not None else fresh[i] for i, r in enumerate(rows)]
    positions = [r.output_index if r.request.sample_seed is not None else 0 for r in rows]
    any_penalties = any(p.has_penalties for p in params)
    bias_parts: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (row, token ids, values)
    banned_parts: list[tuple[int, torch.Tensor]] = []  # (row, token ids banned until min_tokens)
    restricted_rows: list[int] = []
    allowed_masks: list[torch.Tensor] = []
    bad_rows: list[int] = []
    bad_tokens: list[int] = []
    for i, r in enumerate(rows):
        p = r.request.sampling_params
        if p.logit_bias:
            bias_parts.append((i, *logit_bias_tensors(r.request, vocab_size, device)))
        if r.output_index < p.min_tokens:
            banned_parts.append((i, min_tokens_bans(r.request, vocab_size, device)))
        if p.allowed_token_ids is not None:
            restricted_rows.append(i)
            allowed_masks.append(allowed_mask(r.request, vocab_size, device))
        if r.request.bad_words_token_ids:
            # The request's known output: a bad word of several tokens keeps it known each step
            # (LLMEngine._needs_known_outputs) and does not speculate (policy.request_can_speculate).
            bad = banned_next(r.request.bad_words_token_ids, r.request.output_token_ids)
            bad_rows += [i] * len(bad)
            bad_tokens += bad

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return device_tensor(values, dtype, device)

    def padded(lists: list[list[int]]) -> torch.Tensor:
        width = max((len(x) for x in lists), default=0)
        return tensor([x + [vocab_size] * (width - len(x)) for x in lists], torch.long).reshape(n, width)

    def cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return torch.cat(parts) if parts else tensor([], dtype)

    def rows_of(parts: list[tuple[int, torch.Tensor]]) -> torch.Tensor:  # each part's row index, once per entry
        return cat([torch.full_like(t, i) for i, t in parts], torch.long)

    empty: list[list[int]] = [[] for _ in rows]
    logprobs = [p.logprobs for p in params if p.logprobs is not None]
    temperatures = [0.0 if p.temperature < GREEDY_TEMPERATURE else min(p.temperature, TEMPERATURE_CEILING)
                    for p in params]
    return SamplingBatch(
        temperature=tensor(temperatures, torch.float32),
        # Beyond the vocabulary top_k keeps every token: clamped so it always fits an int64 tensor.
        top_k=tensor([min(max(p.top_k, 0), vocab_size) for p in params], torch.long),
        top_p=tensor([p.top_p for p in params], torch.float32),
        min_p=tensor([p.min_p for p in params], torch.float32),
        seeds=tensor(seeds, torch.long),
        positions=tensor(positions, torch.long),
        presence_penalty=tensor([p.presence_penalty for p in params], torch.float32),
        frequency_penalty=tensor([p.frequency_penalty for p in params], torch.float32),
        repetition_penalty=tensor([p.repetition_penalty for p in params], torch.float32),
        output_tokens=padded([r.request.output_token_ids for r in rows] if any_penalties else empty),
        prompt_tokens=padded([r.request.prompt_token_ids for r in rows] if any_penalties else empty),
        bias_rows=rows_of([(i, t) for i, t, _ in bias_parts]),
        bias_tokens=cat([t for _, t, _ in bias_parts], torch.long),
        bias_values=cat([v for _, _, v in bias_parts], torch.float32),
        banned_rows=rows_of(banned_parts),
        banned_tokens=cat([t for _, t in banned_parts], torch.long),
        restricted_rows=tensor(restricted_rows, torch.long),
        allowed_masks=torch.stack(allowed_masks) if allowed_masks else torch.ones(0, vocab_size, dtype=torch.bool,
                                                                                   device=device),
        bad_rows=tensor(bad_rows, torch.long),
        bad_tokens=tensor(bad_tokens, torch.long),
        all_greedy=all(t == 0 for t in temperatures),
        any_penalties=any_penalties,
        any_truncation=any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params),
        max_logprobs=max(logprobs) if logprobs else None,
        logprobs_mode=logprobs_mode,
    )


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

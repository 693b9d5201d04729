"""Build the sampler's per-row tensors from the requests that draw a token this step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flotilla.engine.bad_words import banned_next
from flotilla.engine.penalty_counts import PenaltyCounts
from flotilla.engine.request import Request
from flotilla.engine.sampler import SamplingBatch
from flotilla.engine.sampling_params import (
    GREEDY_TEMPERATURE,
    REPETITION_PENALTY_CEILING,
    REPETITION_PENALTY_FLOOR,
)
from flotilla.engine.staging import device_tensor

# The penalty tables of a step without penalties (never read).
_NO_TABLE = torch.zeros(0, 0)


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
    counts: PenaltyCounts | None = None,
) -> SamplingBatch:
    """Per-row parameters as tensors; requests without a seed get a fresh stream from `generator`.
    `logprobs_mode`: --logprobs-mode (what the rows' logprobs report). `counts`: the runner's persistent token
    counts for the penalties (None: counted from scratch, for this batch only)."""
    params = [r.request.sampling_params for r in rows]
    seeds, positions = _seeds_and_positions(rows, generator)
    sparse = _gather_sparse(rows, vocab_size, device)
    to = _DeviceLists(device, vocab_size)
    any_penalties = any(p.has_penalties for p in params)
    # The penalties read the counts of the tokens a row has seen; without any, the step touches none. A row without
    # penalties of its own reads the zero row: with repetition 1 and frequency and presence 0 the counts change
    # nothing.
    if any_penalties:
        counts = counts if counts is not None else PenaltyCounts(device, len(rows))
        penalised = [r.request if p.has_penalties else None for r, p in zip(rows, params, strict=True)]
        penalty_rows = counts.rows(penalised, vocab_size)
        output_counts, prompt_seen = counts.output, counts.prompt
    else:
        penalty_rows = to.tensor([], torch.long)
        output_counts = prompt_seen = _NO_TABLE
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
        penalty_rows=penalty_rows,
        output_counts=output_counts,
        prompt_seen=prompt_seen,
        bias_rows=to.tensor(sparse.bias.rows, torch.long),
        bias_index=to.tensor(sparse.bias.index, torch.long),
        bias_table=to.table(sparse.bias.table, torch.float32),
        banned_rows=to.tensor(sparse.banned.rows, torch.long),
        banned_index=to.tensor(sparse.banned.index, torch.long),
        banned_table=to.table(sparse.banned.table, torch.bool),
        restricted_rows=to.tensor(sparse.allowed.rows, torch.long),
        allowed_index=to.tensor(sparse.allowed.index, torch.long),
        allowed_table=to.table(sparse.allowed.table, torch.bool),
        bad_rows=to.tensor(sparse.bad_rows, torch.long),
        bad_tokens=to.tensor(sparse.bad_tokens, torch.long),
        all_greedy=all(t == 0 for t in temperatures),
        any_greedy=any(t == 0 for t in temperatures),
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


class _SharedRows:
    """Batch rows that each read a per-request `[V]` tensor, with each distinct tensor once: a request's n
    completions share theirs (`Request.sampler_tensors`), so the step stacks one `[V]` row for all n."""

    def __init__(self) -> None:
        self.rows: list[int] = []  # the batch rows that have one
        self.index: list[int] = []  # each one's row of `table`
        self.table: list[torch.Tensor] = []  # the distinct tensors, in order of first use
        self._slots: dict[int, int] = {}  # id(tensor) -> its row of `table` (the tensors live through the step)

    def add(self, row: int, tensor: torch.Tensor) -> None:
        """Row `row` reads `tensor`."""
        slot = self._slots.setdefault(id(tensor), len(self.table))
        if slot == len(self.table):
            self.table.append(tensor)
        self.rows.append(row)
        self.index.append(slot)


@dataclass
class _SparseEntries:
    """The step's per-token constraints, gathered row by row: only the rows that ask for one add to it."""

    bias: _SharedRows = field(default_factory=_SharedRows)  # logit_bias as dense [V] float32 rows
    banned: _SharedRows = field(default_factory=_SharedRows)  # [V] bool: banned until min_tokens
    allowed: _SharedRows = field(default_factory=_SharedRows)  # [V] bool: allowed_token_ids
    bad_rows: list[int] = field(default_factory=list)  # (row, token) pairs a bad word forbids this step
    bad_tokens: list[int] = field(default_factory=list)


def _gather_sparse(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> _SparseEntries:
    """The logit bias, min_tokens bans, allowed-token masks and bad-word bans of the rows that have them."""
    sparse = _SparseEntries()
    for i, r in enumerate(rows):
        p = r.request.sampling_params
        if p.logit_bias:
            sparse.bias.add(i, logit_bias_row(r.request, vocab_size, device))
        if r.output_index < p.min_tokens:
            sparse.banned.add(i, min_tokens_bans(r.request, vocab_size, device))
        if p.allowed_token_ids is not None:
            sparse.allowed.add(i, allowed_mask(r.request, vocab_size, device))
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

    def table(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """`[u, vocab_size]`: the distinct per-request rows (a view of the one row when there is one)."""
        if len(parts) == 1:
            return parts[0].unsqueeze(0)
        if parts:
            return torch.stack(parts)
        return torch.zeros(0, self.vocab_size, dtype=dtype, device=self.device)


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


def logit_bias_row(request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The request's `logit_bias` as a dense `[vocab_size]` float32 row on `device` (0 for the tokens it leaves
    alone), built once per request: a step adds it with one row operation, whatever the bias's length."""

    def make() -> tuple[torch.Tensor, ...]:
        bias = request.sampling_params.logit_bias or {}
        kept = [(t, v) for t, v in bias.items() if 0 <= t < vocab_size]  # the engine refuses others (check_vocab)
        row = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        if kept:
            row[device_tensor([t for t, _ in kept], torch.long, device)] = device_tensor([v for _, v in kept],
                                                                                           torch.float32, device)
        return (row,)

    return _cached(request, "bias", device, make)[0]


def min_tokens_bans(request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The ids a request may not draw before `min_tokens` (its stop ids, and EOS unless `ignore_eos`), as a
    `[vocab_size]` bool row on `device`, built once per request."""

    def make() -> tuple[torch.Tensor, ...]:
        stops = request.stop_token_set | (frozenset() if request.sampling_params.ignore_eos else request.eos_token_ids)
        mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        # The engine refuses ids outside the vocabulary; an EOS id of a padded config may still be.
        mask[device_tensor(sorted(t for t in stops if 0 <= t < vocab_size), torch.long, device)] = True
        return (mask,)

    return _cached(request, "bans", device, make)[0]

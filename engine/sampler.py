"""Turn logits into next tokens, batched on tensors: the same code on CPU and GPU.

The pipeline per step, each stage a pure function over the whole batch:
grammar bitmask (structured output; applied by the runner before either the greedy fast path or
`sample`) -> logit bias -> min_tokens bans -> repetition/frequency/presence penalties -> allowed_token_ids
and bad_words masks -> temperature -> min-p -> top-k and top-p -> draw.

What `logprobs` report is --logprobs-mode's (vLLM's names and points): raw_logprobs (the default) and raw_logits
are taken from the logits as the model (and the grammar bitmask) left them, before every stage above;
processed_logprobs and processed_logits from those the row draws from: after the masks, and for sampled
rows after temperature and truncation (a greedy row's are its masked logits, as vLLM resets a greedy
request's top-k/top-p/min-p).

Draws use the exponential race (argmax of p / E with E ~ Exp(1)), where E comes from a counter-based
hash of (request seed, output position, token id). A seeded request therefore draws the same
token at the same position whatever else shares the batch, with no per-request generator loop. On the CPU only
what can win is hashed: no greedy row, and in a row whose tokens of probability > 0 are few (top-k, top-p, min-p,
allowed_token_ids) only those, for the same draws (a token of probability 0 loses whatever its E).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from flotilla.engine.truncation import apply_top_k_top_p

_NEG_INF = float("-inf")
# The lowest log-probability reported (vLLM's server clamps to the same): a banned token's -inf, or a
# NaN from a pathological row, must never reach a response, where JSON has no spelling for either.
LOGPROB_FLOOR = -9999.0


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as tensors (one row per token to draw)."""

    temperature: torch.Tensor  # [B] float32; 0 = greedy
    top_k: torch.Tensor  # [B] int64; 0 = off
    top_p: torch.Tensor  # [B] float32; 1 = off
    min_p: torch.Tensor  # [B] float32; 0 = off
    seeds: torch.Tensor  # [B] int64: the stream of random numbers for this row
    positions: torch.Tensor  # [B] int64: output index of the token being drawn
    presence_penalty: torch.Tensor  # [B] float32
    frequency_penalty: torch.Tensor  # [B] float32
    repetition_penalty: torch.Tensor  # [B] float32
    # The penalties' inputs (engine/penalty_counts.py): each row's row of two tables kept up to date step by step.
    penalty_rows: torch.Tensor  # [B] int64 (empty when no row has penalties)
    output_counts: torch.Tensor  # [u, V + 1] int32: occurrences of each token in a request's output so far
    prompt_seen: torch.Tensor  # [u, V + 1] bool: the tokens of a request's prompt
    # Per-request [V] rows (logit_bias, min_tokens bans, allowed_token_ids), each distinct row once in a table
    # and a row index into it per batch row that has one: a request's n completions share theirs, so a
    # vocabulary-long bias costs a step one [V] row, not n (nor n x its length in (row, token) pairs).
    bias_rows: torch.Tensor  # [b] int64: the rows with a logit_bias
    bias_index: torch.Tensor  # [b] int64: each one's row of bias_table
    bias_table: torch.Tensor  # [u, V] float32: the biases, dense (0 for the tokens a bias leaves alone)
    banned_rows: torch.Tensor  # [m] int64: the rows still short of their min_tokens
    banned_index: torch.Tensor  # [m] int64: each one's row of banned_table
    banned_table: torch.Tensor  # [u, V] bool: the tokens (stop ids, EOS) such a row may not draw
    restricted_rows: torch.Tensor  # [r] int64: the rows with allowed_token_ids
    allowed_index: torch.Tensor  # [r] int64: each one's row of allowed_table
    allowed_table: torch.Tensor  # [u, V] bool: what such a row may draw
    # bad_words: (row, token) pairs forbidden this step
    bad_rows: torch.Tensor  # [w] int64
    bad_tokens: torch.Tensor  # [w] int64
    all_greedy: bool
    any_penalties: bool
    any_truncation: bool
    max_logprobs: int | None  # largest top-N any row asked for; None = no logprobs this step
    logprobs_mode: str = "raw_logprobs"  # --logprobs-mode: which logits the logprobs report
    any_greedy: bool = True  # some row has temperature 0 (False: no row needs the argmax of its logits)


@dataclass
class SamplerOutput:
    """Drawn tokens and, when asked for, their log-probabilities (still on the device)."""

    token_ids: torch.Tensor  # [B]
    logprobs: torch.Tensor | None = None  # [B] log-probability of the drawn token
    ranks: torch.Tensor | None = None  # [B] 1 = the most likely token
    top_ids: torch.Tensor | None = None  # [B, N]
    top_logprobs: torch.Tensor | None = None  # [B, N]
    accepted: torch.Tensor | None = None  # [B] bool: the row's draft token was accepted (speculation)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Forbid the tokens whose bit is clear in `bitmask` (`[B, ceil(V/32)]` int32, token t is bit t % 32
    of word t // 32, xgrammar's layout); columns past the mask's width (padding) are forbidden too."""
    vocab = logits.shape[1]
    # Little-endian words: token t is bit t % 8 of byte t // 8. One lookup per byte unpacks 8 tokens.
    allowed = _byte_bits(bitmask.device)[bitmask.contiguous().view(torch.uint8).int()].flatten(1)
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    return logits.masked_fill(allowed[:, :vocab].logical_not_(), _NEG_INF)


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """`[256, 8]` bools: bit j of byte value b."""
    if device not in _BYTE_BITS:
        values = torch.arange(256, device=device).unsqueeze(1)
        _BYTE_BITS[device] = ((values >> torch.arange(8, device=device)) & 1).bool()
    return _BYTE_BITS[device]


def apply_logit_bias(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Add each row's logit_bias to its tokens."""
    # (Rows gathered by indexing, not index_select: on a CPU of 2 threads under load index_select stalled
    # for up to 0.5 s a call, 20x the other stages' worst.) Rows are distinct: one add per entry.
    if b.bias_rows.numel():
        logits.index_add_(0, b.bias_rows, b.bias_table[b.bias_index])
    return logits


def apply_bans(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Forbid stop tokens until a row has its min_tokens."""
    if b.banned_rows.numel():
        rows = b.banned_rows
        logits.index_copy_(0, rows, logits[rows].masked_fill_(b.banned_table[b.banned_index], _NEG_INF))
    return logits


def apply_token_masks(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Forbid what allowed_token_ids leaves out and what bad_words bans this step. A new tensor when
    anything is masked: the caller's logits stay unmasked for the logprobs (vLLM reports them before these
    masks). Without such rows it costs nothing (the index tensors are empty; no device work)."""
    if not b.restricted_rows.numel() and not b.bad_rows.numel():
        return logits
    if b.restricted_rows.numel():
        keep = torch.ones_like(logits, dtype=torch.bool)
        keep[b.restricted_rows] = b.allowed_table[b.allowed_index]
        logits = logits.masked_fill(keep.logical_not_(), _NEG_INF)
    else:
        logits = logits.clone()
    if b.bad_rows.numel():
        logits[b.bad_rows, b.bad_tokens] = _NEG_INF
    return logits


def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """vLLM's penalties: repetition over prompt and output tokens, then frequency and presence over output."""
    vocab = logits.shape[1]
    out_counts = b.output_counts[b.penalty_rows, :vocab].float()  # exact integers, as a recount's float sums
    seen = b.prompt_seen[b.penalty_rows, :vocab] | (out_counts > 0)
    rep = b.repetition_penalty.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits = logits - b.frequency_penalty.unsqueeze(1) * out_counts
    return logits - b.presence_penalty.unsqueeze(1) * (out_counts > 0).float()


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's."""
    if logits.device.type == "cpu" and not bool((min_p > 0).any()):
        return logits  # nothing is below 0 (nor below NaN): a batch without min_p skips 4 passes over [B, V]
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, _NEG_INF)


_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9 as a signed 64-bit integer
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijective scramble of 64-bit integers (wrapping arithmetic)."""
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def _shr_into(x: torch.Tensor, s: int, out: torch.Tensor) -> torch.Tensor:
    """`_shr(x, s)` written into `out` (no new tensor)."""
    return torch.bitwise_right_shift(x, s, out=out).bitwise_and_((1 << (64 - s)) - 1)


def _mix64_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`_mix64` in place on `x`, with `scratch` (same shape) for the shifted copies: the same values, but two
    [B, V] int64 buffers in all instead of a fresh one per operation."""
    x.bitwise_xor_(_shr_into(x, 30, scratch)).mul_(_MIX1)
    x.bitwise_xor_(_shr_into(x, 27, scratch)).mul_(_MIX2)
    return x.bitwise_xor_(_shr_into(x, 31, scratch))


_TOKEN_KEYS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """`[V]` int64: token t's offset (t + 1) * golden in the hash's input, made once per vocabulary and device."""
    key = (vocab_size, device)
    if key not in _TOKEN_KEYS:
        _TOKEN_KEYS[key] = (torch.arange(vocab_size, device=device, dtype=torch.int64) + 1) * _GOLDEN
    return _TOKEN_KEYS[key]


# Most elements of a CPU chunk: what bounds the two int64 buffers a sampling thread keeps (`_buffers`) to 16 MiB each.
# Not smaller: every chunk's ~20 passes are ~20 parallel regions, and with 2 threads on loaded cores each one can stall
# (1 MiB chunks, 8 at B 16 x V 49,152: 1.3 s wall a call vs 0.33 s in one chunk at load ~18); at 1 thread the
# chunk size made no difference (in-cache 1 MiB chunks saved nothing measurable).
_CPU_CHUNK = 1 << 21
_CPU_BUFFERS = threading.local()


def _buffers(elements: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two flat int64 buffers of at least `elements`: on the CPU the calling thread's own, reused from call to
    call (a fresh multi-MiB tensor is fresh pages: the kernel zeroing them cost twice the hash itself); elsewhere
    new ones (a caching allocator hands memory back without that cost)."""
    if device.type != "cpu":
        return (torch.empty(elements, dtype=torch.int64, device=device),
                torch.empty(elements, dtype=torch.int64, device=device))
    held: tuple[torch.Tensor, torch.Tensor] | None = getattr(_CPU_BUFFERS, "held", None)
    if held is None or held[0].numel() < elements:
        # Plain tensors even when made under inference mode (the runner's): an inference tensor cannot be written
        # outside it, and the same thread may sample there later (a test, an offline caller).
        with torch.inference_mode(False):
            held = (torch.empty(elements, dtype=torch.int64), torch.empty(elements, dtype=torch.int64))
        _CPU_BUFFERS.held = held
    return held


def _noise_rows(
    row_keys: torch.Tensor, token_keys: torch.Tensor, bits: torch.Tensor, scratch: torch.Tensor
) -> torch.Tensor:
    """Exp(1) draws for the hashed rows `row_keys` and tokens `token_keys`, broadcast together (`[r, 1]` and `[V]`:
    whole rows; `[n]` and `[n]`: (row, token) pairs), computed in place in the flat int64 buffers `bits` and
    `scratch`: the result is a view of `bits`' memory, valid until they are reused. Every step is elementwise, so a
    pair's draw is the same whichever layout computed it."""
    # (Not torch.broadcast_shapes: ~0.1 ms a call, a tenth of a one-row race.)
    shape = (row_keys.shape[0], token_keys.shape[0]) if row_keys.dim() == 2 else (row_keys.shape[0],)
    n = math.prod(shape)
    x = torch.add(row_keys, token_keys, out=bits[:n].view(shape))
    shifted = scratch[:n].view(shape)
    _mix64_(x, shifted)
    # E = -log(1 - v), v uniform in (0, 1) from 53 bits: float32 keeps v's relative precision near 0, where a
    # draw decides the race (a small E lets an unlikely token win). A 24-bit grid put one token in 2^24 at
    # E = 0 (clamped to 1e-10): it beat any likely token, ~0.8% of draws at a 128k vocabulary.
    ulp53 = _shr_into(x, 11, shifted).add_(1)
    # The float32 values go to the first half of the hash's memory (the hash is spent); copy_ rounds as .float().
    v = bits[:n].view(torch.float32)[:n].view(shape).copy_(ulp53)
    v.mul_(2.0**-53).clamp_(max=1.0 - 2.0**-24)
    return v.neg_().log1p_().neg_()


def _row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`[B]` int64: each row's part of the hash's input, from its seed and output position."""
    return _mix64(seeds * _GOLDEN + positions)


def _noise_chunks(row_keys: torch.Tensor, vocab_size: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """`exponential_noise` of hashed rows `row_keys` by row chunks: (rows, their draws, a view valid until the next
    chunk). On the CPU a chunk is as many rows as `_CPU_CHUNK` holds (all of a decode batch of the embedded model's
    up to 42 rows), in the thread's reused buffers; elsewhere all rows."""
    rows = row_keys.shape[0]
    step = max(1, _CPU_CHUNK // max(vocab_size, 1)) if row_keys.device.type == "cpu" else max(rows, 1)
    token_keys = _token_keys(vocab_size, row_keys.device)
    bits, scratch = _buffers(min(step, rows) * vocab_size, row_keys.device)
    for start in range(0, rows, step):
        chunk = slice(start, min(start + step, rows))
        yield chunk, _noise_rows(row_keys[chunk].unsqueeze(1), token_keys, bits, scratch)


def exponential_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[B, V]` Exp(1) draws that depend only on (seed, position, token id)."""
    # Each [B, V] step of the hash writes into one of two buffers, not a fresh tensor (~20 of those: on the CPU
    # the kernel zeroing their new pages cost more than the arithmetic).
    noise = torch.empty(seeds.shape[0], vocab_size, device=seeds.device)
    for rows, draws in _noise_chunks(_row_keys(seeds, positions), vocab_size):
        if seeds.device.type != "cpu":
            return draws  # a single chunk, in memory of its own
        noise[rows] = draws
    return noise


def race(drawn_from: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Each row's draw from softmax(`drawn_from`): the exponential race, argmax of p / E (`exponential_noise`).
    On the CPU a greedy row (temperature 0) is not hashed: its entry is its argmax of `drawn_from` (callers take
    the masked logits' argmax for it anyway)."""
    probs = torch.softmax(drawn_from, dim=-1)
    if probs.device.type == "cpu":
        return _race_cpu(drawn_from, probs, b)
    for rows, draws in _noise_chunks(_row_keys(b.seeds, b.positions), drawn_from.shape[1]):
        probs[rows].div_(draws)
    return probs.argmax(dim=-1)


# A sampled row (of a batch with truncation or allowed_token_ids) whose tokens of probability > 0 are at most
# 1 / _FEW_KEPT of its vocabulary races those alone on the CPU: any other token's p / E is 0 whatever its E, so it
# cannot win, and its hash (~20 passes of int64 arithmetic) is skipped.
_FEW_KEPT = 4


def _race_cpu(drawn_from: torch.Tensor, probs: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """`race` on the CPU, hashing only what can win: no greedy row, and for a row whose tokens of probability > 0
    are few, only those (host decisions on the values cost no device sync here)."""
    row_keys = _row_keys(b.seeds, b.positions)
    # Only a row holding a probability of 0 can have few kept tokens (the least: one cheap pass; NaN if any is), and
    # only truncation or allowed_token_ids make that common enough to look for. Not a low temperature's underflow:
    # at T 0.2 the embedded model's rows kept 20 to 48,586 tokens, and the search and the kept rows' temporaries
    # (fresh pages, where the whole rows reuse the thread's buffers) cost more than they saved (5.7 vs 4.9 ms a
    # step of 8 rows with the search alone, 5.2 vs 5.0 with rows of <= V / 4 kept raced alone).
    may_drop = b.any_truncation or bool(b.restricted_rows.numel())
    any_zero = may_drop and probs.numel() > 0 and float(probs.min()) == 0
    if not b.any_greedy and not any_zero:
        return _race_rows(probs, row_keys)  # every row whole: the plain race, nothing more
    sampled = b.temperature != 0
    tokens = drawn_from.argmax(dim=-1) if b.any_greedy else torch.empty(probs.shape[0], dtype=torch.long)
    candidates = ((probs.amin(dim=1) == 0) & sampled).nonzero().flatten() if any_zero else sampled[:0].long()
    if candidates.numel():
        few, drawn = _race_few(probs, candidates, row_keys)
        if few.numel():
            tokens[few] = drawn
            sampled[few] = False
    whole = sampled.nonzero().flatten()
    if whole.numel():
        tokens[whole] = _race_rows(_some_rows(probs, whole), row_keys[whole])
    return tokens


def _some_rows(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`values[rows]`, without the copy when `rows` is every row (in order, as `nonzero` lists them)."""
    return values if rows.numel() == values.shape[0] else values[rows]


def _race_rows(probs: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """argmax of p / E over whole rows: `probs` (a scratch of the caller's, divided in place) and their hashed keys."""
    for chunk, draws in _noise_chunks(row_keys, probs.shape[1]):
        probs[chunk].div_(draws)
    return probs.argmax(dim=-1)


def _race_few(probs: torch.Tensor, candidates: torch.Tensor,
              row_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the `candidates` rows whose tokens of probability > 0 are at most 1 / _FEW_KEPT of the vocabulary, their
    draws): argmax of p / E over those tokens alone. The same p / E values as the whole row's (the same elementwise
    hash and division), hence the same winner, ties to the lowest token id as argmax breaks them. The finding and
    gathering is NumPy's (its compare, nonzero and take cost a fraction of torch's on the CPU); the arithmetic
    torch's, as the whole row's."""
    vocab = probs.shape[1]
    values = _some_rows(probs, candidates).numpy()
    kept = values > 0
    counts = np.count_nonzero(kept, axis=1)
    # A row with nothing kept (no finite logit) takes the whole-row race: its argmax says what it draws.
    picked = (counts > 0) & (counts <= vocab // _FEW_KEPT)
    if not picked.all():
        values, kept, counts = values[picked], kept[picked], counts[picked]
    rows = candidates[torch.from_numpy(picked)]
    flat = np.flatnonzero(kept)  # row-major: each row's kept tokens in id order
    row, token = np.divmod(flat, vocab)
    bits, scratch = _buffers(flat.size, probs.device)
    draws = _noise_rows(row_keys[rows].index_select(0, torch.from_numpy(row)),
                        _token_keys(vocab, probs.device).index_select(0, torch.from_numpy(token)), bits, scratch)
    ratio = torch.from_numpy(values.reshape(-1).take(flat)).div_(draws).numpy()
    starts = np.cumsum(counts) - counts
    best = np.maximum.reduceat(ratio, starts)
    return rows, torch.from_numpy(np.minimum.reduceat(np.where(ratio == best.repeat(counts), token, vocab), starts))


def sampling_logits(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """The logits each row draws from, after temperature, min-p, top-k and top-p (greedy rows'
    entries are those of temperature 1; callers take their argmax instead)."""
    scaled = logits / torch.where(b.temperature == 0, 1.0, b.temperature).unsqueeze(1)
    if b.any_truncation:
        scaled = apply_top_k_top_p(apply_min_p(scaled, b.min_p), b.top_k, b.top_p)
    return scaled


def raw_values(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor | None:
    """Under a raw --logprobs-mode, the values to report, taken from the logits before any stage changes them
    (logit_bias and min_tokens write in place); None when the step reports none or reports processed ones."""
    if b.max_logprobs is None or not b.logprobs_mode.startswith("raw"):
        return None
    return torch.log_softmax(logits, dim=-1) if b.logprobs_mode == "raw_logprobs" else logits.clone()


def reported_values(
    b: SamplingBatch, raw: torch.Tensor | None, masked: torch.Tensor, drawn_from: torch.Tensor | None
) -> torch.Tensor:
    """What `logprobs` report under --logprobs-mode: `raw` (from `raw_values`), or the processed logits: the
    `masked` ones for greedy rows, `drawn_from` (`sampling_logits`; None in an all-greedy batch) for sampled
    rows; as logits or their log-softmax."""
    if raw is not None:
        return raw
    processed = masked
    if drawn_from is not None:
        processed = torch.where((b.temperature == 0).unsqueeze(1), masked, drawn_from)
    return processed if b.logprobs_mode == "processed_logits" else torch.log_softmax(processed, dim=-1)


def sample(logits: torch.Tensor, b: SamplingBatch) -> SamplerOutput:
    """Run the whole pipeline on fp32 logits `[B, V]`."""
    raw = raw_values(logits, b)
    logits = apply_bans(apply_logit_bias(logits, b), b)
    if b.any_penalties:
        logits = apply_penalties(logits, b)
    logits = apply_token_masks(logits, b)
    drawn_from = None
    if b.all_greedy:
        token_ids = logits.argmax(dim=-1)
    else:
        drawn_from = sampling_logits(logits, b)
        token_ids = race(drawn_from, b)
        if b.any_greedy:
            token_ids = torch.where(b.temperature == 0, logits.argmax(dim=-1), token_ids)
    out = SamplerOutput(token_ids=token_ids)
    if b.max_logprobs is not None:
        add_logprobs(out, reported_values(b, raw, logits, drawn_from), b.max_logprobs, b.logprobs_mode)
    return out


def token_ranks(logprobs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each row's rank of its chosen value [B, 1] among the row's values [B, V], as vLLM counts it: the values
    >= it (itself included), so a token tied with others ranks after them all (1 = the most likely)."""
    # int32 sums: an int64 one first copied the [B, V] comparison into a [B, V] int64 tensor (~1/3 of the
    # logprobs' cost of a CPU step); a vocabulary is far below 2^31.
    return (logprobs >= chosen).sum(dim=1, dtype=torch.int32)


def _ranks_from_top(chosen: torch.Tensor, top_values: torch.Tensor) -> torch.Tensor | None:
    """`token_ranks` from each row's top-k values (descending) when every row's chosen value is above its k-th,
    so that every value >= it is among them; else None. Only on the CPU, where asking costs no device sync: it
    saves a pass over [B, V] in the common case (a greedy row's token, or a sampled one of the top k)."""
    if chosen.is_cuda or not bool((chosen > top_values[:, -1:]).all()):
        return None
    return (top_values >= chosen).sum(dim=1, dtype=torch.int32)


def add_logprobs(out: SamplerOutput, values: torch.Tensor, n: int, mode: str = "raw_logprobs") -> None:
    """The drawn token's log-probability (or logit, under a *_logits mode) and rank, and the top-n of each row
    (finite: at least LOGPROB_FLOOR; log-probabilities at most 0). `values` is the caller's scratch
    (`reported_values`): it is made finite in place, not copied (a [B, V] allocation a step)."""
    top = 0.0 if mode.endswith("logprobs") else None
    logprobs = values.nan_to_num_(nan=LOGPROB_FLOOR, posinf=top, neginf=LOGPROB_FLOOR).clamp_(LOGPROB_FLOOR, top)
    chosen = logprobs.gather(1, out.token_ids.unsqueeze(1))
    out.logprobs = chosen.squeeze(1)
    # At least one: the k-th value decides whether the ranks can come from the top values (n = 0 reports none).
    top_values, top_ids = logprobs.topk(max(n, 1), dim=-1)
    ranks = _ranks_from_top(chosen, top_values)
    out.ranks = ranks if ranks is not None else token_ranks(logprobs, chosen)
    out.top_logprobs, out.top_ids = top_values[:, :n], top_ids[:, :n]

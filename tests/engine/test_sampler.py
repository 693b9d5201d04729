"""The sampler's math against independent NumPy definitions, on crafted logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from flotilla.engine import sampler
from flotilla.engine.request import Request
from flotilla.engine.sampler import apply_min_p, apply_penalties, apply_top_k_top_p, exponential_noise, sample
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams

V = 50


def _batch(params: list[SamplingParams], outputs: list[list[int]] | None = None, prompts=None, seed=0):
    rows = []
    for i, p in enumerate(params):
        r = Request(str(i), (prompts or [[1, 2, 3]] * len(params))[i], p, eos_token_ids=frozenset({2}))
        r.output_token_ids = list((outputs or [[]] * len(params))[i])
        rows.append(SamplingRow(r, i, r.num_output_tokens))
    return build_sampling_batch(rows, V, torch.device("cpu"), torch.Generator().manual_seed(seed))


def _np_top_k_top_p(logits: np.ndarray, k: int, p: float) -> np.ndarray:
    """From the definitions, in float64: keep logits >= the k-th largest; then drop the least likely
    tokens while their total probability stays within 1 - p (the nucleus keeps mass >= p)."""
    out = logits.astype(np.float64)
    if k > 0:
        kth = np.sort(out)[::-1][k - 1]
        out[out < kth] = -np.inf
    probs = np.exp(out - out.max())
    probs /= probs.sum()
    order = np.argsort(probs, kind="stable")
    drop = np.cumsum(probs[order]) <= 1 - p
    drop[-1] = False
    out[order[drop]] = -np.inf
    return out


@pytest.mark.parametrize(("k", "p"), [(0, 1.0), (5, 1.0), (0, 0.5), (7, 0.8), (1, 0.3), (0, 0.05), (50, 0.99)])
def test_top_k_top_p_mask_matches_numpy(k, p):
    rng = np.random.default_rng(k * 100 + int(p * 100))
    logits = rng.normal(size=(4, V)).astype(np.float32) * 3
    got = apply_top_k_top_p(torch.tensor(logits), torch.full((4,), k), torch.full((4,), p)).numpy()
    for row in range(4):
        assert np.array_equal(np.isinf(got[row]), np.isinf(_np_top_k_top_p(logits[row], k, p)))
        kept = ~np.isinf(got[row])
        assert np.array_equal(got[row][kept], logits[row][kept])


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 0.9])
def test_min_p_mask_matches_numpy(min_p):
    logits = np.random.default_rng(3).normal(size=(3, V)).astype(np.float32) * 2
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    expected = probs < min_p * probs.max(1, keepdims=True)
    got = apply_min_p(torch.tensor(logits), torch.full((3,), min_p)).numpy()
    assert np.array_equal(np.isinf(got), expected)


def test_penalties_match_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0] + [0.0] * (V - 5)])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    b = _batch([params], outputs=[[0, 0, 1, 4]], prompts=[[3, 7]])
    got = apply_penalties(logits.clone(), b)[0]
    # token 0: seen (output x2) -> 2/2 - 0.25*2 - 0.5; token 1: -1*2 - 0.25 - 0.5
    # token 3: prompt only -> -3*2 (no frequency/presence); token 4: 1/2 - 0.25 - 0.5; token 2 untouched
    expected = {0: 1.0 - 0.5 - 0.5, 1: -2.0 - 0.25 - 0.5, 2: 0.5, 3: -6.0, 4: 0.5 - 0.25 - 0.5, 7: 0.0}
    for token, value in expected.items():
        assert got[token].item() == pytest.approx(value), token


@pytest.mark.parametrize("penalty", [1e-50, 1e50])
def test_a_repetition_penalty_beyond_fp32_keeps_the_row_finite_and_its_limit_draw(penalty):
    # vLLM takes any finite penalty above 0; in fp32 1e-50 is 0 (a seen positive logit / 0 = inf: a NaN row) and
    # 1e50 inf. The draw is the limit's: a tiny penalty makes the best seen token win, a huge one the best unseen.
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5] + [-5.0] * (V - 4)])
    b = _batch([SamplingParams(temperature=1.0, repetition_penalty=penalty)], outputs=[[0, 1]], prompts=[[3]])
    got = apply_penalties(logits.clone(), b)
    assert torch.isfinite(got).all()
    assert torch.isfinite(torch.log_softmax(got, dim=-1)).all()
    assert got.argmax().item() == (0 if penalty < 1 else 2)


def test_logit_bias_and_min_tokens_ban():
    logits = torch.zeros(2, V)
    b = _batch(
        [
            SamplingParams(temperature=0, logit_bias={9: 5.0}),
            SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[4]),
        ]
    )
    logits[1, 2] = logits[1, 4] = 10.0  # EOS and a stop token would win, but min_tokens forbids them
    out = sample(logits, b)
    assert out.token_ids.tolist()[0] == 9
    assert out.token_ids.tolist()[1] not in (2, 4)



def test_a_requests_completions_read_one_shared_row_of_each_table():
    # As LLMEngine.add_request builds them, a request's n completions share their sampler tensors: the step holds
    # one [V] row of its whole-vocabulary bias, its min_tokens bans and its allowed ids for all n (it gathered n x
    # the bias's length in (row, token) pairs every step: 2x a plain request's time at n=48), and each row still
    # gets its own request's.
    shared: dict = {}
    many = SamplingParams(temperature=0, n=3, logit_bias={**{t: 0.5 for t in range(V)}, 7: 60.0}, min_tokens=2,
                          stop_token_ids=[11, 12] * 2, allowed_token_ids=[7, 11, 30])
    rows = [SamplingRow(Request(f"a{i}", [1], many, index=i, sampler_tensors=shared), i, 0) for i in range(3)]
    rows.append(SamplingRow(Request("b", [1], SamplingParams(temperature=0, logit_bias={3: 60.0})), 3, 0))
    b = build_sampling_batch(rows, V, torch.device("cpu"), torch.Generator())
    assert b.bias_table.shape == (2, V) and b.bias_index.tolist() == [0, 0, 0, 1]
    assert b.banned_table.shape == (1, V) and b.banned_rows.tolist() == [0, 1, 2]
    assert b.allowed_table.shape == (1, V) and b.restricted_rows.tolist() == [0, 1, 2]
    logits = torch.zeros(4, V)
    logits[:3, 11] = 100.0  # the three's favourite, banned until min_tokens
    # 30 wins for the three only with their whole-vocabulary 0.5 (60.2 against 7's 60); the last row draws its
    # own biased 3 (60), none of theirs.
    logits[:, 30] = 59.7
    assert sample(logits, b).token_ids.tolist() == [30, 30, 30, 3]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_are_log_softmax_of_the_raw_or_processed_logits(mode):
    logits = torch.randn(2, V)
    params = [
        SamplingParams(temperature=0.7, logprobs=5, repetition_penalty=1.3, logit_bias={3: 2.0}),
        SamplingParams(temperature=0, logprobs=3),
    ]
    b = _batch(params, outputs=[[1, 3], [5]])
    b.logprobs_mode = mode
    out = sample(logits.clone(), b)
    if mode == "raw_logprobs":  # the model's own (vLLM's default)
        expected = torch.log_softmax(logits, dim=-1)
    else:  # what the draw used: bias, penalties, then the sampled row's temperature
        processed = logits.clone()
        processed[0, 3] += 2.0
        processed = apply_penalties(processed, b)
        processed[0] /= 0.7
        expected = torch.log_softmax(processed, dim=-1)
    chosen = out.token_ids
    assert torch.allclose(out.logprobs, expected.gather(1, chosen[:, None]).squeeze(1), atol=1e-6)
    assert torch.allclose(out.top_logprobs, expected.topk(5, dim=-1).values, atol=1e-6)
    assert out.ranks.tolist() == [int((expected[i] > expected[i, chosen[i]]).sum()) + 1 for i in range(2)]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_ranks_and_top_n_match_a_full_count_with_ties_and_tokens_outside_the_top(n):
    """The ranks count every value >= the chosen one (vLLM's ties rule) whether they come from the top-n values
    (each row's chosen token above its n-th) or from the whole row (a chosen token at or below it), and the
    top-n are the sanitized row's (NaN and -inf at the floor)."""
    from flotilla.engine.sampler import LOGPROB_FLOOR, SamplerOutput, add_logprobs

    values = torch.tensor([[0.0, -1.0, -1.0, -2.0, -3.0, float("nan")],  # chosen 0: alone on top
                           [-1.0, -1.0, -0.5, -2.0, float("-inf"), -3.0],  # chosen 1: tied, below the top
                           [-5.0, -1.0, -1.0, -2.0, -3.0, -4.0],  # chosen 0: far outside any top-n
                           [-2.0, -2.0, -2.0, -2.0, -2.0, -2.0]])  # chosen 3: all tied
    chosen = torch.tensor([0, 1, 0, 3])
    sanitized = values.nan_to_num(nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)
    expected_ranks = [int((sanitized[i] >= sanitized[i, t]).sum()) for i, t in enumerate(chosen.tolist())]
    assert expected_ranks == [1, 3, 6, 6]
    for rows in ([0], [0, 1], [0, 1, 2, 3]):  # a batch whose ranks the top-n decide, then ones they cannot
        out = SamplerOutput(token_ids=chosen[rows])
        add_logprobs(out, values[rows].clone(), n)
        assert out.ranks is not None and out.top_logprobs is not None and out.top_ids is not None
        assert out.ranks.tolist() == [expected_ranks[i] for i in rows]
        assert out.logprobs.tolist() == [sanitized[i, chosen[i]].item() for i in rows]
        top = sanitized[rows].topk(n, dim=-1)
        assert torch.equal(out.top_logprobs, top.values) and torch.equal(out.top_ids, top.indices)


def test_seeded_noise_depends_only_on_seed_position_and_token():
    a = exponential_noise(torch.tensor([7, 8, 7]), torch.tensor([3, 3, 4]), V)
    b = exponential_noise(torch.tensor([9, 7]), torch.tensor([0, 3]), V)
    assert torch.equal(a[0], b[1])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (NumPy wraps array arithmetic modulo 2^64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@pytest.mark.parametrize(("rows", "vocab", "chunk"),
                         [(3, V, None), (5, 50_000, 1 << 17), (2, 140_000, 1 << 17), (4, 50_000, None), (0, 10, None)])
def test_noise_is_splitmix64_of_seed_position_and_token_whatever_the_chunking(rows, vocab, chunk, monkeypatch):
    """The noise as documented, from an independent uint64 definition: v = (hash >> 11 + 1) / 2^53 with hash =
    mix(mix(seed * golden + position) + (token + 1) * golden), E = -log1p(-v). With the CPU chunk at 2^17 elements
    (None: the default) the cases cover one chunk, rows in chunks of two with a partial last one, a vocabulary
    wider than a chunk, and the thread's buffers reused by a smaller call: the values must not depend on how the
    rows are cut."""
    if chunk is not None:
        monkeypatch.setattr(sampler, "_CPU_CHUNK", chunk)
    seeds = np.array([0, 1, 2**62 - 1, 12345, 987654321][:rows], dtype=np.uint64)
    positions = np.array([0, 7, 3, 100_000, 1][:rows], dtype=np.uint64)
    golden = np.uint64(0x9E3779B97F4A7C15)
    row = _splitmix64(seeds * golden + positions)
    bits = _splitmix64(row[:, None] + (np.arange(vocab, dtype=np.uint64)[None, :] + np.uint64(1)) * golden)
    v = np.minimum(((bits >> np.uint64(11)) + np.uint64(1)).astype(np.float32) * np.float32(2.0**-53),
                   np.float32(1.0 - 2.0**-24))
    expected = -torch.log1p(-torch.from_numpy(v))  # torch's log1p: the same rounding as the sampler's
    got = exponential_noise(torch.from_numpy(seeds.astype(np.int64)), torch.from_numpy(positions.astype(np.int64)),
                            vocab)
    assert got.dtype == torch.float32 and got.shape == (rows, vocab)
    assert torch.equal(got, expected)


def test_noise_is_the_same_from_threads_sampling_at_once():
    """Each thread has its own CPU buffers: threads hashing at the same time (torch releases the GIL in its
    kernels) get the noise a lone call gets."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [(torch.arange(k, dtype=torch.long) * 31 + k, torch.full((k,), k, dtype=torch.long), 20_000 + k)
             for k in range(1, 7)]
    expected = [exponential_noise(*case) for case in cases]
    with ThreadPoolExecutor(len(cases)) as pool:
        for _ in range(5):
            got = list(pool.map(lambda case: exponential_noise(*case), cases))
            assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_a_thread_that_sampled_under_inference_mode_samples_outside_it():
    """The runner samples under torch.inference_mode; the thread's CPU buffers made there must stay writable
    outside it (an offline caller or a test sampling on the same thread): they were inference tensors, and the
    next call outside raised 'Inplace update to inference tensor outside InferenceMode'."""
    from concurrent.futures import ThreadPoolExecutor

    seeds, positions = torch.tensor([4, 5]), torch.tensor([0, 9])

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            inside = exponential_noise(seeds, positions, 3000)  # a fresh thread: its buffers are made here
        return inside, exponential_noise(seeds, positions, 3000)

    with ThreadPoolExecutor(1) as pool:
        inside, outside = pool.submit(both).result()
    assert torch.equal(inside, outside)


@pytest.mark.parametrize("chunk", [None, 1 << 17])
def test_a_seeded_row_draws_the_same_token_alone_and_anywhere_in_a_batch(chunk, monkeypatch):
    """Batch composition changes neither the noise nor the draw: a seeded row at a position, alone or at any place
    of a batch, next to greedy and unseeded rows; in one CPU chunk (the default) and in chunks of two rows."""
    if chunk is not None:
        monkeypatch.setattr(sampler, "_CPU_CHUNK", chunk)
    vocab = 50_000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(5))
    ours = SamplingParams(temperature=0.9, seed=77)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=1.3), SamplingParams(temperature=0.5, seed=3)]

    def draw(params: list[SamplingParams]) -> list[int]:
        rows = []
        for i, p in enumerate(params):
            r = Request(str(i), [1, 2, 3], p)
            rows.append(SamplingRow(r, i, 40))
        b = build_sampling_batch(rows, vocab, torch.device("cpu"), torch.Generator().manual_seed(len(params)))
        return sample(logits.expand(len(params), vocab).clone(), b).token_ids.tolist()

    alone = draw([ours])[0]
    assert draw([SamplingParams(temperature=0)])[0] == int(logits.argmax())
    for place in (0, 3, 6):
        batch = [others[i % 3] for i in range(6)]
        batch.insert(place, ours)
        tokens = draw(batch)
        assert tokens[place] == alone
        assert all(t == int(logits.argmax()) for t, p in zip(tokens, batch, strict=True) if p.temperature == 0)


def test_a_token_of_negligible_probability_is_not_drawn_on_the_noise_floor():
    """The noise's uniform had 24 bits, so one token in 2^24 got u = 1, hence E = -log(u) = 0, clamped to 1e-10,
    and won the race against any likely token: a token of probability 2e-9 was drawn. At a 128k vocabulary
    that happened in ~0.8% of draws at temperature 1 (32,768 rows of a 2e-9 tail: 13 tail draws, not 0.6).
    These seeds (position 0) had a token on the floor: 5992 token 34, 11805 token 873, 42039 token 541."""
    vocab = 2048
    cases = [(5992, 34), (11805, 873), (42039, 541)]
    logits = torch.full((len(cases), vocab), float("-inf"))
    logits[:, 0] = 0.0
    for row, (_, token) in enumerate(cases):
        logits[row, token] = -20.0  # p = 2e-9
    b = _batch([SamplingParams(temperature=1.0)] * len(cases))
    b.seeds = torch.tensor([seed for seed, _ in cases])
    assert sample(logits, b).token_ids.tolist() == [0] * len(cases)
    noise = exponential_noise(torch.arange(4096), torch.zeros(4096, dtype=torch.long), 512)
    assert float(noise.min()) > 0 and not torch.isnan(noise).any()


def test_sampling_at_temperature_one_follows_softmax():
    """Chi-square goodness of fit of 20,000 draws (distinct seeds) against softmax(logits)."""
    torch.manual_seed(0)
    logits = torch.randn(1, V) * 1.5
    n = 20_000
    b = _batch([SamplingParams(temperature=1.0)] * n)
    b.seeds = torch.arange(n, dtype=torch.long) * 7919 + 17
    counts = np.bincount(sample(logits.expand(n, V).clone(), b).token_ids.numpy(), minlength=V)
    probs = torch.softmax(logits[0], -1).numpy().astype(np.float64)
    big = probs * n >= 5  # chi-square needs expected counts >= 5; pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(probs[big] * n, probs[~big].sum() * n)
    assert stats.chisquare(observed, expected).pvalue > 0.001


def test_temperature_sharpens_and_top_k_one_is_greedy():
    logits = torch.randn(1, V)
    n = 4000
    for temperature, top_k in [(0.05, 0), (1.0, 1)]:
        b = _batch([SamplingParams(temperature=temperature, top_k=top_k)] * n)
        b.seeds = torch.arange(n, dtype=torch.long)
        tokens = sample(logits.expand(n, V).clone(), b).token_ids
        assert (tokens == logits.argmax()).float().mean() > 0.99

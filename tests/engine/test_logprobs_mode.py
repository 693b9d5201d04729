"""--logprobs-mode on a real (tiny) model: which logits a request's `logprobs` report (vLLM's four modes)."""

from __future__ import annotations

import math

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampler import LOGPROB_FLOOR
from flotilla.engine.sampling_params import SamplingParams

PROMPT = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    """One tiny Llama per mode, built on first use."""
    built: dict[str, LLM] = {}

    def get(mode: str) -> LLM:
        if mode not in built:
            built[mode] = LLM(str(tiny_model_dirs["llama"]), max_model_len=128, block_size=8, logprobs_mode=mode)
        return built[mode]

    return get


def _first_entry(llm: LLM, params: SamplingParams) -> tuple[int, dict[int, tuple[float, int]]]:
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    return out.token_ids[0], out.logprobs[0]


def _top(entry: dict[int, tuple[float, int]], n: int) -> list[tuple[int, float]]:
    return sorted(((t, v) for t, (v, rank) in entry.items() if rank <= n), key=lambda x: -x[1])


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]], abs: float = 1e-5) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=abs)


def test_by_default_logprobs_are_the_models_before_bias_bans_and_penalties(engines):
    """vLLM's default (raw_logprobs) reports the model's distribution: logit_bias, min_tokens and penalties
    change what is drawn, not the logprobs. They were reported after those (the drawn token's logprob moved
    with its bias)."""
    llm = engines("raw_logprobs")
    plain_token, plain = _first_entry(llm, SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    biased_token = min(t for t, (_, rank) in plain.items() if rank == 5)
    token, entry = _first_entry(llm, SamplingParams(
        temperature=0, max_tokens=1, logprobs=5, logit_bias={biased_token: 100.0}, repetition_penalty=1.7,
        min_tokens=1, stop_token_ids=[plain_token]))
    assert token == biased_token  # the bias decided the draw
    _same(_top(entry, 5), _top(plain, 5))
    assert entry[token][0] == pytest.approx(plain[token][0]) and entry[token][1] == 5


def test_raw_logits_are_the_logits_and_processed_ones_are_what_the_draw_used(engines):
    """temperature 0.5 and top_k 3: processed logits are the raw ones / 0.5 on the top 3, -inf (the floor)
    elsewhere; processed logprobs their log-softmax; raw_logits the model's logits (not a distribution)."""
    params = SamplingParams(temperature=0.5, top_k=3, seed=11, max_tokens=1, logprobs=5)
    token, raw = _first_entry(engines("raw_logits"), params)
    raw_top = _top(raw, 5)
    kept = raw_top[:3]
    processed_token, processed = _first_entry(engines("processed_logits"), params)
    assert processed_token == token  # the same draw: only the report differs
    _same(_top(processed, 3), [(t, v / 0.5) for t, v in kept])
    assert [v for t, (v, rank) in processed.items() if rank in (4, 5)] == [LOGPROB_FLOOR, LOGPROB_FLOOR]
    _, logprobs = _first_entry(engines("processed_logprobs"), params)
    norm = math.log(sum(math.exp(v / 0.5) for _, v in kept))
    _same(_top(logprobs, 3), [(t, v / 0.5 - norm) for t, v in kept], abs=1e-4)


def test_a_greedy_rows_processed_logprobs_are_its_masked_logits(engines):
    """Greedy rows draw the argmax: no temperature or truncation in their processed logprobs (vLLM resets a
    greedy request's top_k), but the bias is in them."""
    _, raw = _first_entry(engines("raw_logprobs"), SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    target = min(t for t, (_, rank) in raw.items() if rank == 2)
    params = SamplingParams(temperature=0, top_k=1, max_tokens=1, logprobs=5, logit_bias={target: 3.0})
    token, entry = _first_entry(engines("processed_logits"), params)
    _, raw_logits = _first_entry(engines("raw_logits"), params)
    assert token == target and entry[target][1] == 1
    assert entry[target][0] == pytest.approx(raw_logits[target][0] + 3.0)
    assert sum(1 for v, _ in entry.values() if v == LOGPROB_FLOOR) == 0

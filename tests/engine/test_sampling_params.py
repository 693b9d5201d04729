"""SamplingParams refuses what the sampler cannot serve, with a ValueError naming the field, and the
engine's own arithmetic stays within int64 for every value it accepts (the offline `LLM` path)."""

from __future__ import annotations

import re

import pytest
import torch

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.request import Request
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),  # vLLM's bound: above 0, finite
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"logprobs": -2}, "logprobs"),  # -1 is vLLM's whole vocabulary; the upper bound is --max-logprobs
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"logit_bias": {3: float("nan")}}, "logit_bias"),
        ({"presence_penalty": float("-inf")}, "presence_penalty"),
    ],
)
def test_out_of_range_values_name_their_field(kwargs, param):
    with pytest.raises(ValueError, match=param) as caught:
        SamplingParams(**kwargs)
    assert isinstance(caught.value, InvalidParamError) and caught.value.param == param


@pytest.mark.parametrize("temperature", [2.0000001, 2.5, 50.0, 1e39, 1e300])
def test_temperature_above_2_is_refused_in_vllms_words(temperature):
    # vLLM 0.24's SamplingParams bounds temperature to [0, 2] (vllm-project/vllm#44965), offline and served alike.
    refusal = re.escape(f"temperature must be in [0, 2], got {temperature}.")
    with pytest.raises(InvalidParamError, match=refusal) as caught:
        SamplingParams(temperature=temperature)
    assert caught.value.param == "temperature"


def test_temperature_bounds_are_inclusive():
    assert (SamplingParams(temperature=0.0).temperature, SamplingParams(temperature=2.0).temperature) == (0.0, 2.0)
    with pytest.raises(InvalidParamError, match=r"temperature must be non-negative, got -0\.5\."):
        SamplingParams(temperature=-0.5)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"top_k": 2**70}, "top_k"), ({"top_k": 101}, "top_k"), ({"stop_token_ids": [100]}, "stop_token_ids"),
     ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"logit_bias": {100: 1.0}}, "logit_bias"),
     ({"logit_bias": {-1: 1.0}}, "logit_bias")],
)
def test_vocabulary_check_names_the_field(kwargs, param):
    with pytest.raises(InvalidParamError, match="vocabulary") as caught:
        SamplingParams(**kwargs).check_vocab(100)
    assert caught.value.param == param


def test_values_at_the_vocabulary_edge_pass():
    SamplingParams(top_k=100, stop_token_ids=[0, 99], logit_bias={99: 1.0}).check_vocab(100)


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 4611686018427387904, 0, 12345])
def test_per_completion_seed_fits_int64_and_differs_by_index(seed):
    params = SamplingParams(seed=seed, n=2)
    seeds = [Request(f"r{i}", [1], params, index=i).sample_seed for i in range(2)]
    assert all(-(2**63) <= s < 2**63 for s in seeds)
    assert seeds[0] != seeds[1]
    torch.tensor(seeds, dtype=torch.long)  # what the sampler builds from them


def test_small_seeds_keep_their_stream():
    # Wrapping changes nothing where nothing overflowed; completion i draws as seed + i (vLLM's children).
    assert Request("r", [1], SamplingParams(seed=42), index=3).sample_seed == 45 * 1_000_003


def test_sampling_batch_clamps_top_k_and_skips_ids_beyond_the_vocabulary():
    # What a caller that skips `check_vocab` hands the sampler must still index inside [B, V].
    params = SamplingParams(top_k=2**70, min_tokens=2, stop_token_ids=[10**9], temperature=1e-30)
    request = Request("r", [1, 2], params, eos_token_ids=frozenset({7, 10**6}))
    batch = build_sampling_batch([SamplingRow(request, 0, 0)], 50, torch.device("cpu"), torch.Generator())
    assert batch.top_k.tolist() == [50]
    assert batch.banned_table[batch.banned_index].nonzero()[:, 1].tolist() == [7]
    assert batch.all_greedy  # a temperature below 1e-5 is greedy, as vLLM's


@pytest.mark.parametrize(("penalty", "used"),
                         [(5e-324, 1e-20), (1e-50, 1e-20), (0.5, 0.5), (1e50, 1e20), (1e300, 1e20)])
def test_any_positive_repetition_penalty_is_taken_and_the_sampler_uses_a_finite_one(penalty, used):
    # vLLM takes any finite penalty above 0; in fp32 1e50 is inf and 1e-50 is 0 (a logit / 0 is inf: a NaN row).
    request = Request("r", [1, 2], SamplingParams(repetition_penalty=penalty))
    batch = build_sampling_batch([SamplingRow(request, 0, 0)], 50, torch.device("cpu"), torch.Generator())
    assert batch.repetition_penalty.tolist() == pytest.approx([used])


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=64)


def test_offline_llm_serves_a_seed_whose_mix_overflows(llm):
    params = SamplingParams(max_tokens=4, seed=4611686018427387904)
    first, second = (llm.generate(["Hello"], params, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2))
    assert first == second and len(first) == 4


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"top_k": 2**70}, "top_k"), ({"min_tokens": 2, "stop_token_ids": [1000000000]}, "stop_token_ids"),
     ({"logit_bias": {10**9: 1.0}}, "logit_bias")],
)
def test_offline_llm_refuses_ids_beyond_the_vocabulary_and_keeps_working(llm, kwargs, param):
    with pytest.raises(InvalidParamError, match=param):
        llm.generate(["Hello"], SamplingParams(max_tokens=4, **kwargs), use_tqdm=False)
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert len(llm.generate(["Hello"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids) == 2

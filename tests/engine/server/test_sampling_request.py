"""engine/server/sampling_request.py without a server: a request body's sampling fields -> SamplingParams (the
server tests, test_bad_input and test_sampling_bounds, show the same rules through HTTP)."""

from __future__ import annotations

import pytest

from flotilla.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import CompletionRequest
from flotilla.engine.server.sampling_request import (
    MAX_LOGPROB_ENTRIES,
    check_logprob_entries,
    max_tokens_cap,
    sampling_params,
)


def request(**fields):
    return CompletionRequest(prompt="hi", **fields)


def test_a_field_left_out_takes_the_models_default_else_the_neutral_value():
    sp = sampling_params(request(top_p=0.5), None, 4, 64, None, defaults={"temperature": 0.6, "top_p": 0.9})
    assert (sp.temperature, sp.top_p, sp.top_k) == (0.6, 0.5, 0)


def test_max_tokens_is_the_context_left_when_not_given_and_the_cap_bounds_it_given_or_not():
    assert sampling_params(request(), None, 4, 64, None).max_tokens == 60
    assert sampling_params(request(), None, 4, 64, None, defaults={"max_tokens": 8}).max_tokens == 8
    assert sampling_params(request(), 50, 4, 64, None, max_tokens_cap=10).max_tokens == 10


def test_max_tokens_beyond_the_context_left_is_a_400_naming_it():
    with pytest.raises(APIError) as err:
        sampling_params(request(), 61, 4, 64, None)
    assert (err.value.status, err.value.param) == (400, "max_tokens")
    assert "your request has 4 input tokens (61 > 64 - 4)" in err.value.message


def test_an_unsupported_vllm_field_set_is_a_400_and_its_off_value_passes():
    with pytest.raises(APIError) as err:
        sampling_params(request(use_beam_search=True), None, 4, 64, None)
    assert err.value.param == "use_beam_search"
    assert sampling_params(request(use_beam_search=False, logits_processors=[]), None, 4, 64, None).n == 1


def test_logit_bias_is_clamped_and_needs_token_ids():
    assert sampling_params(request(logit_bias={"3": 500.0}), None, 4, 64, None).logit_bias == {3: 100.0}
    with pytest.raises(APIError) as err:
        sampling_params(request(logit_bias={"a": 1.0}), None, 4, 64, None)
    assert err.value.param == "logit_bias"


def test_the_cap_comes_from_a_generation_config_folder_else_the_override():
    assert max_tokens_cap("/models/gc", {"max_tokens": 32}, {"max_new_tokens": 8}) == 32
    assert max_tokens_cap("auto", {"max_tokens": 32}, {"max_new_tokens": 8}) == 8
    assert max_tokens_cap("vllm", {}, {}) is None


def test_generated_logprobs_past_the_entry_bound_are_a_400_naming_the_field():
    # A chat request on a 128k context: n=8 x max_tokens 131,000 x (top_logprobs 20 + 1) is 22M entries, held by
    # the engine until the request ends and built whole into a non-streamed reply.
    sp = SamplingParams(n=8, max_tokens=131_000, logprobs=20)
    with pytest.raises(APIError) as err:
        check_logprob_entries([10], [sp], 1, "prompt_logprobs", "top_logprobs", MAX_LOGPROBS)
    assert (err.value.status, err.value.param) == (400, "top_logprobs")
    assert f"at most {MAX_LOGPROB_ENTRIES}" in err.value.message and "8 completions" in err.value.message
    # One completion of 128k tokens with 20 logprobs a token fits (vLLM's --max-logprobs 20 stays servable).
    check_logprob_entries([10], [SamplingParams(max_tokens=131_000, logprobs=20)], 1,
                          "prompt_logprobs", "logprobs", MAX_LOGPROBS)
    # No logprobs asked for: no bound.
    check_logprob_entries([10], [SamplingParams(n=128, max_tokens=131_000)], 1,
                          "prompt_logprobs", "logprobs", MAX_LOGPROBS)


def test_prompt_and_generated_logprobs_share_the_bound():
    # 100k prompt tokens x 21 is 2.1M entries, and 100k generated tokens x 21 another 2.1M: together past 4M.
    both = SamplingParams(max_tokens=100_000, logprobs=20, prompt_logprobs=20)
    with pytest.raises(APIError) as err:
        check_logprob_entries([100_000], [both], 1, "prompt_logprobs", "logprobs", MAX_LOGPROBS)
    assert err.value.param == "logprobs" and "2100000 of them the prompt's" in err.value.message
    check_logprob_entries([100_000], [both.model_copy(update={"logprobs": None})], 1,
                          "prompt_logprobs", "logprobs", MAX_LOGPROBS)


def test_logprobs_without_max_tokens_are_served_within_the_bound_not_refused():
    # Chat n=2, top_logprobs 20 and no max_tokens on a 128k context: max_tokens defaults to the context left
    # (131,000), 2 x 131,000 x 21 = 5.5M. The client set no limit to lower, so the one the server chose is lowered
    # to what fits (vLLM serves this request; refusing it asked the client to fix a value it never sent).
    sp = SamplingParams(n=2, max_tokens=131_000, logprobs=20)
    [fitted] = check_logprob_entries([10], [sp], 1,
                                     "prompt_logprobs", "top_logprobs", MAX_LOGPROBS, max_tokens_given=False)
    assert fitted.max_tokens == MAX_LOGPROB_ENTRIES // (2 * 21)
    assert fitted.model_copy(update={"max_tokens": sp.max_tokens}) == sp  # nothing else changes
    # Within the bound already: unchanged. Several prompts share the room.
    one = SamplingParams(max_tokens=131_000, logprobs=20)
    assert check_logprob_entries([10], [one], 1,
                                 "prompt_logprobs", "logprobs", MAX_LOGPROBS, max_tokens_given=False) == [one]
    fitted = check_logprob_entries([10, 10], [sp, sp], 2,
                                   "prompt_logprobs", "logprobs", MAX_LOGPROBS, max_tokens_given=False)
    assert [p.max_tokens for p in fitted] == [MAX_LOGPROB_ENTRIES // (4 * 21)] * 2
    # A max_tokens the client gave is never changed: still the 400 naming the field.
    with pytest.raises(APIError) as err:
        check_logprob_entries([10], [sp], 1, "prompt_logprobs", "top_logprobs", MAX_LOGPROBS)
    assert err.value.param == "top_logprobs"
    # No room left for even min_tokens: the 400 as before.
    tight = SamplingParams(n=128, max_tokens=131_000, min_tokens=2000, logprobs=20)
    with pytest.raises(APIError):
        check_logprob_entries([10], [tight], 1, "prompt_logprobs", "logprobs", MAX_LOGPROBS, max_tokens_given=False)

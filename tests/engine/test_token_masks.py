"""vLLM's `allowed_token_ids` and `bad_words` end to end: the tiny random model for the id sets, the embedded
SmolLM2 for words (its greedy text holds real words to ban)."""

from __future__ import annotations

import pytest

from flotilla.engine.bad_words import bad_word_token_ids, banned_next, reads_output
from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.spec_decode.policy import request_can_speculate
from flotilla.engine.structured_output.params import StructuredOutputsParams

PROMPT = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]
FRANCE = "The capital of France is"


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8)


@pytest.fixture(scope="module")
def smol(embedded_model_dir):
    return LLM(str(embedded_model_dir), max_model_len=256)


def _out(llm, prompt, **kwargs):
    return llm.generate([prompt], SamplingParams(**kwargs), use_tqdm=False)[0].outputs


def test_greedy_and_sampled_draws_come_only_from_allowed_token_ids(tiny):
    free = _out(tiny, PROMPT, temperature=0, max_tokens=12, ignore_eos=True)[0].token_ids
    allowed = [t for t in range(500, 520) if t not in free]
    greedy = _out(tiny, PROMPT, temperature=0, max_tokens=12, ignore_eos=True, allowed_token_ids=allowed)[0]
    assert set(greedy.token_ids) <= set(allowed) and greedy.token_ids != free
    # n > 1, sampled, beside an unconstrained request in the same batch
    params = [SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True, allowed_token_ids=allowed),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    masked, plain = tiny.generate([PROMPT, PROMPT], params, use_tqdm=False)
    assert all(set(c.token_ids) <= set(allowed) for c in masked.outputs)
    assert len({tuple(c.token_ids) for c in masked.outputs}) > 1
    assert plain.outputs[0].token_ids == free, "the unmasked neighbour is untouched"


def test_logprobs_are_those_before_the_masks_as_vllms(tiny):
    free = _out(tiny, PROMPT, temperature=0, max_tokens=1, ignore_eos=True, logprobs=2)[0]
    allowed = [t for t in range(500, 520) if t != free.token_ids[0]]
    masked = _out(tiny, PROMPT, temperature=0, max_tokens=1, ignore_eos=True, logprobs=2, allowed_token_ids=allowed)[0]
    drawn = masked.token_ids[0]
    assert drawn in allowed
    # vLLM's default logprobs_mode (raw_logprobs): the unmasked distribution, so the top entries are those of
    # the unconstrained request and the drawn token has its unmasked logprob and rank.
    top = {t: v for t, v in free.logprobs[0].items() if v[1] <= 2}
    assert {t: v for t, v in masked.logprobs[0].items() if t != drawn or v[1] <= 2} == top
    assert masked.logprobs[0][drawn][1] > 1


def test_a_bad_word_never_appears_though_the_free_greedy_text_has_it(smol):
    free = _out(smol, FRANCE, temperature=0, max_tokens=30)[0]
    assert free.text.startswith(" Paris")
    banned = _out(smol, FRANCE, temperature=0, max_tokens=30, bad_words=["Paris"])[0]
    assert "Paris" not in banned.text
    ids = {t for seq in bad_word_token_ids(["Paris"], smol.engine.tokenizer, smol.engine.vocab_size) for t in seq}
    assert len(ids) == 2 and not ids & set(banned.token_ids)  # "Paris" and " Paris"
    sampled = _out(smol, FRANCE, n=4, temperature=1.0, seed=3, max_tokens=12, bad_words=["Paris"])
    assert all(not ids & set(c.token_ids) for c in sampled)


def test_a_multi_token_bad_word_is_banned_only_after_its_prefix(smol):
    tokenizer = smol.engine.tokenizer
    the = tokenizer.encode(" the", add_special_tokens=False)
    (of_the, space_of_the) = bad_word_token_ids(["of the"], tokenizer, smol.engine.vocab_size)
    assert of_the[-1] == space_of_the[-1] == the[0] and len(of_the) == 2
    plain = _out(smol, FRANCE, temperature=0, max_tokens=30, bad_words=["Paris"])[0]
    assert plain.text.startswith(" the capital of the French")
    out = _out(smol, FRANCE, temperature=0, max_tokens=30, bad_words=["Paris", "of the"])[0]
    # " the" is still drawn first (no " of" before it), then never right after " of"
    assert out.token_ids[0] == the[0] and out.text.startswith(" the capital of")
    pairs = set(zip(out.token_ids, out.token_ids[1:], strict=False))
    assert of_the not in pairs and space_of_the not in pairs
    assert out.token_ids != plain.token_ids


def test_banned_next_matches_the_end_of_the_output_only():
    seqs = ((5,), (7, 8), (1, 2, 3))
    assert banned_next(seqs, []) == [5]
    assert banned_next(seqs, [7]) == [5, 8]
    assert banned_next(seqs, [7, 9]) == [5]
    assert banned_next(seqs, [1, 2]) == [5, 3]
    assert banned_next(seqs, [2]) == [5]  # a prefix longer than the output never matches
    assert not reads_output(((5,), (6,))) and reads_output(seqs)


def test_masks_combine_with_structured_output(smol):
    choice = StructuredOutputsParams(choice=["Paris", "London", "Rome"])
    assert _out(smol, FRANCE, temperature=0, max_tokens=8, structured_outputs=choice)[0].text == "Paris"
    out = _out(smol, FRANCE, temperature=0, max_tokens=8, structured_outputs=choice, bad_words=["Paris"])[0]
    assert out.text in ("London", "Rome")
    london = smol.engine.tokenizer.encode("London", add_special_tokens=False)
    rome = smol.engine.tokenizer.encode("Rome", add_special_tokens=False)
    eos = sorted(smol.engine.eos_token_ids)
    out = _out(smol, FRANCE, temperature=0, max_tokens=8, structured_outputs=choice, allowed_token_ids=rome + eos)[0]
    assert out.text == "Rome" and london != rome


def test_with_speculative_decoding_the_output_is_that_without(embedded_model_dir, smol):
    spec = LLM(str(embedded_model_dir), max_model_len=256,
               speculative_config={"model": str(embedded_model_dir), "num_speculative_tokens": 3})
    allowed = smol.engine.tokenizer.encode(" the capital of France is Paris, and", add_special_tokens=False)
    cases = [dict(allowed_token_ids=allowed), dict(bad_words=["Paris"]), dict(bad_words=["Paris", "of the"])]
    for extra in cases:
        # 15 tokens: at the 16th, two allowed tokens (28 and 314) tie exactly in the one-position decode pass
        # (logprob -1.5323927 each; the lowest id, 28, wins, as in every greedy pick: test_rejection_sampler.py),
        # but the verify pass computes that position among 4 rows, and its bf16 logits differ by a rounding step
        # (314 -1.5744777, 28 -1.6994777): no tie there. Not a tie-break difference; batch-variant numerics.
        params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True, **extra)
        expected = smol.generate([FRANCE], params, use_tqdm=False)[0].outputs[0].token_ids
        before = spec.engine.speculator.counts.num_drafts
        got = spec.generate([FRANCE], params, use_tqdm=False)[0].outputs[0].token_ids
        assert got == expected, extra
        drafted = spec.engine.speculator.counts.num_drafts > before
        assert drafted == ("of the" not in extra.get("bad_words", [])), extra  # a multi-token word: no drafts


def test_invalid_values_are_refused_naming_the_field(tiny):
    with pytest.raises(InvalidParamError) as err:
        SamplingParams(allowed_token_ids=[])
    assert err.value.param == "allowed_token_ids" and "empty" in str(err.value)
    with pytest.raises(InvalidParamError) as err:
        SamplingParams(bad_words=["ok", "  "])
    assert err.value.param == "bad_words"
    with pytest.raises(InvalidParamError) as err:
        tiny.engine.add_request(PROMPT, SamplingParams(allowed_token_ids=[3, tiny.engine.vocab_size]))
    assert err.value.param == "allowed_token_ids" and "outside the vocabulary" in str(err.value)
    request = Request("r", PROMPT, SamplingParams(), bad_words_token_ids=((4, 5),))
    assert not request_can_speculate(request)


def test_bad_words_are_bounded_as_vllms(smol):
    # vLLM's bounds: 128 token sequences after tokenization (a word gives one, or two with its spaced form),
    # 1024 tokens in all; every step matches each sequence on the host.
    with pytest.raises(InvalidParamError) as err:
        SamplingParams(bad_words=["w"] * 129)
    assert err.value.param == "bad_words" and "at most 128" in str(err.value)
    tokenizer, vocab = smol.engine.tokenizer, smol.engine.vocab_size
    assert len(bad_word_token_ids(["Paris"] * 64, tokenizer, vocab)) == 128
    with pytest.raises(InvalidParamError) as err:
        smol.engine.add_request(FRANCE, SamplingParams(bad_words=["Paris"] * 65))
    assert err.value.param == "bad_words" and "130 token sequences" in str(err.value)
    with pytest.raises(InvalidParamError, match="1024 tokens"):
        bad_word_token_ids(["a b c d e f g h i j"] * 60, tokenizer, vocab)


def test_a_long_allowed_list_is_masked_from_a_row_built_once(tiny):
    everything_but_one = [t for t in range(tiny.engine.vocab_size) if t != 7]
    request = tiny.engine.add_request(PROMPT, SamplingParams(temperature=1.0, seed=1, max_tokens=6, ignore_eos=True,
                                                             allowed_token_ids=everything_but_one * 2))
    while tiny.engine.has_unfinished_requests():
        tiny.engine.step()
    assert 7 not in request.output_token_ids and len(request.output_token_ids) == 6
    (mask,) = request.sampler_tensors["allowed"]
    assert int(mask.sum()) == tiny.engine.vocab_size - 1


def test_with_async_scheduling_a_multi_token_bad_word_sees_every_earlier_token(embedded_model_dir, smol):
    # The ban of " the" after " of" reads the token drawn by the step just before: under async scheduling
    # that step is still in flight when the next is planned, unless the engine waits for its outputs.
    params = [SamplingParams(temperature=0, max_tokens=30, bad_words=["Paris", "of the"]),
              SamplingParams(temperature=0, max_tokens=30, allowed_token_ids=list(range(200, 400)))]
    expected = [o.outputs[0].token_ids for o in smol.generate([FRANCE, FRANCE], params, use_tqdm=False)]
    eager = LLM(str(embedded_model_dir), max_model_len=256, async_scheduling=True)
    got = [o.outputs[0].token_ids for o in eager.generate([FRANCE, FRANCE], params, use_tqdm=False)]
    assert got == expected


def test_masks_that_leave_the_grammar_no_token_refuse_the_request_and_free_it(smol):
    """allowed_token_ids holding no digit, under a digits-only regex: the masks and the grammar's bitmask
    together forbid every token. A refusal naming the field (a 400 through the server), not an engine failure
    (a 500); the engine serves the next request with every block back."""
    letters = smol.get_tokenizer().encode(" hello world", add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=5, allowed_token_ids=letters,
                            structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    with pytest.raises(InvalidParamError, match="allowed_token_ids leave no token") as refused:
        smol.generate(["Number:"], params, use_tqdm=False)
    assert refused.value.param == "allowed_token_ids"
    engine = smol.engine
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.block_manager.num_free_blocks == engine.scheduler.block_manager.num_blocks
    assert _out(smol, FRANCE, temperature=0, max_tokens=3)[0].text



def test_min_tokens_past_the_grammars_end_refuse_the_request_and_free_it(smol):
    """choice yes/no with min_tokens 5: after at most three tokens the choice is complete and the grammar allows
    only a stop token, which min_tokens bans. A refusal naming min_tokens (a 400 through the server), not an
    engine failure (it was RuntimeError "a drawn token does not fit the request's grammar", a 500)."""
    for n in (1, 2):
        params = SamplingParams(temperature=0.7, seed=1, n=n, max_tokens=20, min_tokens=5,
                                structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
        with pytest.raises(InvalidParamError, match="min_tokens 5 bans the stop tokens") as refused:
            smol.generate(["Answer:"], params, use_tqdm=False)
        assert refused.value.param == "min_tokens"
        blocks = smol.engine.block_manager
        assert not smol.engine.has_unfinished_requests() and blocks.num_free_blocks == blocks.num_blocks
    fits = SamplingParams(temperature=0, max_tokens=20, min_tokens=1,
                          structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    assert smol.generate(["Answer:"], fits, use_tqdm=False)[0].outputs[0].text in ("yes", "no")

def test_the_highest_temperature_still_draws_only_allowed_tokens(tiny):
    # 2 is vLLM's highest temperature (SamplingParams refuses more); the flattest draw still keeps to the masks.
    temperature = 2.0
    allowed = [500, 501, 502]
    for masks in ({"allowed_token_ids": allowed}, {"bad_words": ["the"], "allowed_token_ids": allowed}):
        out = _out(tiny, PROMPT, temperature=temperature, seed=3, n=2, max_tokens=6, ignore_eos=True, **masks)
        assert all(set(c.token_ids) <= set(allowed) for c in out), [c.token_ids for c in out]
    # Unmasked, the draw is spread over the vocabulary, not stuck on one token.
    free = _out(tiny, PROMPT, temperature=temperature, seed=3, max_tokens=6, ignore_eos=True, min_tokens=6)[0]
    assert len(set(free.token_ids)) > 1 and 0 not in free.token_ids

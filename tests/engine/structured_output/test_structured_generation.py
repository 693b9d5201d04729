"""Structured output in the offline engine: every output matches its constraint, whatever the batch."""

from __future__ import annotations

import json
import re

import pytest
import torch

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.sampler import apply_token_bitmask
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.structured_output.params import StructuredOutputsParams

jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}
COMPACT = {"disable_any_whitespace": True}


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), device="cpu", max_model_len=256, block_size=8)


@pytest.fixture(scope="module")
def async_llm(tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), device="cpu", max_model_len=256, block_size=8, async_scheduling=True)


def constrained(max_tokens: int = 120, **spec) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=7,
                          structured_outputs=StructuredOutputsParams(**spec))


def test_bitmask_application_matches_xgrammars_reference():
    torch.manual_seed(0)
    vocab = 100
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32)
    logits = torch.randn(3, vocab)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, vocab_size=vocab)
    assert torch.equal(apply_token_bitmask(logits, bitmask), expected)


def test_params_take_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    assert StructuredOutputsParams(json={"type": "object"}).kind == "json"


def test_json_regex_choice_and_grammar_outputs_match(llm, async_llm):
    params = [
        constrained(json=SCHEMA, **COMPACT),
        constrained(regex=r"[a-z]{2,5}-\d{3}"),
        constrained(choice=["red", "green", "blue"]),
        constrained(grammar='root ::= "yes" | "no" | "maybe " [0-9]'),
        constrained(json_object=True, max_tokens=40, **COMPACT),
    ]
    for engine in (llm, async_llm):
        json_out, regex_out, choice_out, grammar_out, object_out = (
            o.outputs[0].text for o in engine.generate(["Answer:"] * 5, params)
        )
        jsonschema.validate(json.loads(json_out), SCHEMA)
        assert re.fullmatch(r"[a-z]{2,5}-\d{3}", regex_out)
        assert choice_out in ("red", "green", "blue")
        assert re.fullmatch(r"yes|no|maybe [0-9]", grammar_out)
        # A random model may not close an unbounded object within max_tokens; what it wrote is a prefix.
        assert object_out.startswith("{")


def test_every_completion_of_n_follows_its_own_grammar(async_llm):
    params = SamplingParams(n=4, max_tokens=40, temperature=1.0, seed=3,
                            structured_outputs=StructuredOutputsParams(regex=r"(cat|dog|eel){1,3}!"))
    texts = [c.text for c in async_llm.generate(["Pets:"], params)[0].outputs]
    assert len(texts) == 4 and len(set(texts)) > 1
    assert all(re.fullmatch(r"(cat|dog|eel){1,3}!", t) for t in texts)


def test_constrained_and_free_requests_share_a_batch(llm):
    free = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    # Not "Hello there": the tiny model's logits tie (1e-6 apart) at its 5th token, and a batch may flip a tie.
    alone = llm.generate(["Once upon a time"], free)[0].outputs[0].token_ids
    outs = llm.generate(["Once upon a time", "Pick:"], [free, constrained(choice=["alpha", "beta"])])
    assert outs[0].outputs[0].token_ids == alone
    assert outs[1].outputs[0].text in ("alpha", "beta")


def test_a_repeated_schema_compiles_once(llm):
    llm.generate(["x"], constrained(json=SCHEMA, **COMPACT))
    compiler = llm.engine.grammar_compiler
    before = compiler.num_compiled
    reordered = dict(reversed(list(SCHEMA.items())))
    llm.generate(["y"], constrained(json=reordered, **COMPACT))
    assert compiler.num_compiled == before


@pytest.mark.parametrize("spec", [
    {"json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}},
    {"json": "{not json"},
    {"regex": "(unclosed"},
    {"grammar": "root ::= undefined_rule"},
])
def test_an_invalid_constraint_is_refused_with_its_reason(llm, spec):
    with pytest.raises(InvalidParamError) as info:
        llm.engine.add_request("x", SamplingParams(structured_outputs=StructuredOutputsParams(**spec)))
    assert info.value.param == "structured_outputs"
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("server_compact, request_compact, spaced_ok", [
    (False, False, True), (False, True, False), (True, False, False)])
def test_whitespace_is_free_unless_the_server_or_the_request_asks_for_compact_json(
        llm, server_compact, request_compact, spaced_ok):
    from flotilla.engine.structured_output.compiler import GrammarCompiler

    compiler = GrammarCompiler(llm.get_tokenizer(), llm.engine.vocab_size, sorted(llm.engine.eos_token_ids),
                               disable_any_whitespace=server_compact)
    compiled = compiler.compile(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=request_compact))
    assert xgr.GrammarMatcher(compiled).accept_string('{"name":"a","age":1,"tags":[]}')
    assert xgr.GrammarMatcher(compiled).accept_string('{\n\n "name": "a"') == spaced_ok


@pytest.mark.parametrize("value, problem", [
    ('{"disable_any_whitespace": "yes"}', "disable_any_whitespace"), ('{"backend": "outlines"}', "backend"),
    ('{"whitespace": true}', "whitespace"), ("[1]", "JSON object"), ("{", "not valid JSON")])
def test_structured_outputs_config_takes_vllms_keys(value, problem):
    from flotilla.engine.structured_output.config import parse_structured_outputs_config

    assert parse_structured_outputs_config('{"backend": "xgrammar", "disable_any_whitespace": true}') \
        .disable_any_whitespace
    with pytest.raises(ValueError, match=problem):
        parse_structured_outputs_config(value)


def test_a_schema_with_its_properties_in_another_order_is_not_served_from_the_cache(llm, async_llm):
    """The grammar emits an object's properties in the schema's order (e.g. "reasoning" before "answer", so that
    a model reasons first). The compiled-grammar cache keyed schemas by their JSON with sorted keys, so a
    schema listing the same properties in another order got the grammar compiled for the first one: its
    output came in the first schema's order. (Each engine has its cache; these schemas are this test's alone, so
    the module's two engines serve as fresh ones: `llm` never compiles the first schema.)"""
    def schema(order: list[str]) -> dict:
        return {"type": "object", "properties": {k: {"type": "integer", "minimum": 0, "maximum": 9} for k in order},
                "required": ["x", "y"], "additionalProperties": False}

    first, second = ["x", "y"], ["y", "x"]
    want = llm.generate([[5, 6, 7]], constrained(60, json=schema(second), **COMPACT), use_tqdm=False)[0]
    engine = async_llm
    engine.generate([[5, 6, 7]], constrained(60, json=schema(first), **COMPACT), use_tqdm=False)
    got = engine.generate([[5, 6, 7]], constrained(60, json=schema(second), **COMPACT), use_tqdm=False)[0]
    assert list(json.loads(want.outputs[0].text)) == second
    assert got.outputs[0].text == want.outputs[0].text


def test_with_ignore_eos_the_output_runs_on_unconstrained_after_the_grammar_completes(llm, async_llm):
    """vLLM's behaviour: the grammar allows only EOS once complete, `ignore_eos` does not stop on it, and a
    terminated grammar leaves every token allowed (`StructuredOutputManager._fill_bitmasks` fills the full
    mask; `accept_tokens` ignores tokens after termination), so generation runs on unconstrained until
    max_tokens: the same tokens as an unconstrained run from the prompt, the choice and EOS."""
    eos = sorted(llm.engine.eos_token_ids)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(choice=["alpha", "beta"]))
    for engine in (llm, async_llm):
        out = engine.generate(["Pick:"], params)[0].outputs[0]
        tokens = out.token_ids
        assert out.finish_reason == "length" and len(tokens) == 10
        assert out.text.startswith(("alpha", "beta"))
        end = next(i for i, t in enumerate(tokens) if t in eos)  # the grammar's last token: EOS
        choice = llm.get_tokenizer().decode(tokens[:end])
        assert choice in ("alpha", "beta")
        prompt = llm.get_tokenizer().encode("Pick:") + tokens[: end + 1]
        free = engine.generate([{"prompt_token_ids": prompt}],
                               SamplingParams(max_tokens=10 - end - 1, temperature=0, ignore_eos=True))
        assert tokens[end + 1 :] == free[0].outputs[0].token_ids

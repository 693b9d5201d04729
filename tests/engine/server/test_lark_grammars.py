"""Lark grammars as structured-output grammars (vLLM's `structured_outputs.grammar` and `guided_grammar` take Lark as
well as EBNF: a grammar with no `::=` rule is Lark), through the real openai client against the shared tiny server,
whose random model follows them because the mask leaves it nothing else."""

from __future__ import annotations

import re

import openai
import pytest

WEATHER = 'start: "It is " WORD "."\nWORD: "warm" | "cold"  // a terminal with alternatives'
CODE = '// a regex terminal and an imported one\nstart: "id-" /[a-z]{3}/ DIGIT DIGIT "!"\n%import common.DIGIT'


@pytest.mark.parametrize("body", [{"structured_outputs": {"grammar": WEATHER}}, {"guided_grammar": WEATHER}])
def test_a_lark_grammar_constrains_every_completion(client, body):
    completion = client.completions.create(model="tiny", prompt="The weather:", n=3, seed=1, temperature=1.0,
                                           max_tokens=16, extra_body=body)
    assert {c.text for c in completion.choices} <= {"It is warm.", "It is cold."}
    assert {c.finish_reason for c in completion.choices} == {"stop"}


def test_a_lark_grammar_with_regex_and_imported_terminals(client):
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "code?"}], n=2,
                                           seed=2, temperature=1.0, max_tokens=24,
                                           extra_body={"structured_outputs": {"grammar": CODE}})
    for choice in reply.choices:
        assert re.fullmatch(r"id-[a-z]{3}[0-9]{2}!", choice.message.content), choice.message.content


def test_a_bad_lark_grammar_is_a_400_with_the_parsers_reason(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", max_tokens=4,
                                  extra_body={"structured_outputs": {"grammar": "start: 'single quotes'"}})
    message = caught.value.body["message"]
    assert "invalid grammar constraint" in message and "Lark error at line 1" in message

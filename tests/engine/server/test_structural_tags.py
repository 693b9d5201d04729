"""Structural tags (vLLM's `response_format: {"type": "structural_tag", ...}` and `structured_outputs.structural_tag`),
both forms xgrammar takes, through the real openai client against the real server on a tiny random model.

The model's vocabulary has `<tool_call>` and `</tool_call>` as tokens (as Qwen's has). It is steered with logit_bias:
`<tool_call>` at +100, so the free text keeps opening the tag, and every whitespace token at -100, so the JSON inside
closes (the tag's schemas allow any whitespace, as vLLM compiles them: a random model could write whitespace until
max_tokens). The mask does the rest: after the begin string, the output follows the tag's schema and its end."""

from __future__ import annotations

import json
import re

import openai
import pytest
from openai import OpenAI

from .conftest import API_KEY, start_tiny_server, stop_server, tiny_llama_with_markers

SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
          "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Where is it sunny?"}]
# The older form: free text until a trigger, which must go on as a structure's begin.
LEGACY = {"type": "structural_tag", "triggers": ["<tool_call>"],
          "structures": [{"begin": "<tool_call>", "schema": SCHEMA, "end": "</tool_call>"}]}
# The newer form: here one tag is the whole output.
TAGGED = {"type": "structural_tag", "format": {"type": "tag", "begin": "<answer>", "end": "</answer>",
                                               "content": {"type": "json_schema", "json_schema": SCHEMA}}}
BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@pytest.fixture(scope="module")
def tag_model(embedded_model_dir, tmp_path_factory):
    """A tiny random Llama with the embedded tokenizer plus `<tool_call>` and `</tool_call>` (added, not special),
    and the logit_bias that steers it (see the module's docstring)."""
    path = tmp_path_factory.mktemp("structural-tag-model")
    tokenizer = tiny_llama_with_markers(embedded_model_dir, path, ("<tool_call>", "</tool_call>"), seed=32)
    spaces = [i for i in range(len(tokenizer)) if tokenizer.decode([i]) and not tokenizer.decode([i]).strip()]
    bias = {str(i): -100 for i in spaces} | {str(tokenizer.convert_tokens_to_ids("<tool_call>")): 100}
    return path, bias


@pytest.fixture(scope="module")
def client(tag_model, tmp_path_factory):
    path, _ = tag_model
    server = start_tiny_server(path, tmp_path_factory.mktemp("structural-tags") / "server.log")
    yield OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    stop_server(server)


def _blocks(text: str) -> list[dict]:
    """Each closed `<tool_call>` block's JSON (the output may end inside one more, cut by max_tokens)."""
    return [json.loads(body) for body in BLOCK.findall(text)]


def test_the_older_form_constrains_each_block_after_its_trigger(client, tag_model):
    _, bias = tag_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=LEGACY, n=2, seed=3,
                                           temperature=1.0, max_tokens=48, logit_bias=bias)
    for choice in reply.choices:
        text = choice.message.content or ""
        assert text.startswith("<tool_call>"), text  # the biased trigger, free to come first
        blocks = _blocks(text)
        assert blocks and all(b in ({"city": "Paris"}, {"city": "Rome"}) for b in blocks), text


def test_the_older_form_streamed_sends_the_same_kind_of_text(client, tag_model):
    _, bias = tag_model
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=LEGACY, n=2, seed=4,
                                            temperature=1.0, max_tokens=48, logit_bias=bias, stream=True)
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    for text in texts:
        blocks = _blocks(text)
        assert blocks and all(b in ({"city": "Paris"}, {"city": "Rome"}) for b in blocks), text


@pytest.mark.parametrize("as_text", [True, False])
def test_the_newer_form_in_structured_outputs_makes_the_whole_completion(client, tag_model, as_text):
    # vLLM's field takes the tag's JSON text; an object is taken too.
    _, bias = tag_model
    tag = json.dumps(TAGGED) if as_text else TAGGED
    completion = client.completions.create(model="tiny", prompt="The city:", n=2, seed=5, temperature=1.0,
                                           max_tokens=40, logit_bias=bias,
                                           extra_body={"structured_outputs": {"structural_tag": tag}})
    for choice in completion.choices:
        match = re.fullmatch(r"<answer>(.*)</answer>", choice.text, re.DOTALL)
        assert match is not None, choice.text
        assert json.loads(match.group(1)) in ({"city": "Paris"}, {"city": "Rome"})
        assert choice.finish_reason == "stop"


def test_the_newer_form_as_response_format_on_chat(client, tag_model):
    _, bias = tag_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=TAGGED, seed=6,
                                           temperature=1.0, max_tokens=40, logit_bias=bias)
    text = reply.choices[0].message.content
    assert text.startswith("<answer>") and text.endswith("</answer>"), text
    assert json.loads(text[len("<answer>") : -len("</answer>")]) in ({"city": "Paris"}, {"city": "Rome"})


@pytest.mark.parametrize("tag, reason", [
    ({"type": "structural_tag", "format": {"type": "nope"}}, "Format type not recognized: nope"),
    ({"type": "structural_tag"}, "must have a format field"),
    ({"type": "structural_tag", "triggers": ["<tool_call>"], "structures": [{"begin": "<tool_call>", "end": "x"}]},
     "structures[0] must be an object with begin, schema"),
    ({"type": "structural_tag", "triggers": ["<x"], "structures": [{"begin": "<tool_call>", "schema": SCHEMA,
                                                                     "end": "</tool_call>"}]},
     "does not match any trigger"),
    ({"type": "structural_tag", "triggers": ["<tool_call>"], "structures": [{
        "begin": "<tool_call>", "schema": {"type": "array", "uniqueItems": True}, "end": "</tool_call>"}]},
     "schema at /structures/0/schema: JSON schema keyword 'uniqueItems'"),
    ({"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>", "content": {
        "type": "json_schema", "json_schema": {"type": "object", "not": {"required": ["x"]}}}}},
     "schema at /format/content/json_schema: JSON schema keyword 'not'"),
    ({"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {"type": "objectx"}}},
     'Unsupported type "objectx"'),
])
def test_a_bad_tag_is_a_400_that_names_the_problem(client, tag, reason):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=tag, max_tokens=5)
    assert reason in caught.value.body["message"]
    assert ".cc:" not in caught.value.body["message"]  # xgrammar's source line is not the client's business


@pytest.mark.parametrize("tag, reason", [("{not json", "the structural tag is not JSON"),
                                         ("[1, 2]", "must be a JSON object"),
                                         (7, "structured_outputs.structural_tag"),
                                         ('{"format": ' + "[" * 3000 + "]" * 3000 + "}", "nested too deeply")])
def test_a_structural_tag_that_is_not_a_json_object_is_a_400(client, tag, reason):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", max_tokens=5,
                                  extra_body={"structured_outputs": {"structural_tag": tag}})
    assert reason in caught.value.body["message"]


def test_a_structural_tag_beside_another_constraint_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="one output constraint"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, response_format=TAGGED,
                                       extra_body={"guided_regex": "a+"})

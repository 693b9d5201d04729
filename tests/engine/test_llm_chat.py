"""`LLM.chat`'s vLLM arguments: the prompt it renders is what HF's `apply_chat_template` gives with the same
arguments, and generation runs on it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a ship."}]
# A template that shows what chat() must pass through: tools, an extra variable, and the content's form.
PROBE_TEMPLATE = (
    "{% if tools %}[tools: {{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
    "{% if mood is defined %}[mood: {{ mood }}]{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for call in m.tool_calls or [] %}(call {{ call.function.name }} city={{ call.function.arguments.city }})"
    "{% endfor %}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PARTS_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{% for part in m.content %}[{{ part.type }}:{{ part.text }}]"
                  "{% endfor %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": CITY}}


@pytest.fixture(scope="module")
def llm(tiny_model_dirs) -> LLM:
    return LLM(str(tiny_model_dirs["qwen2"]), max_model_len=512)


def _check(llm: LLM, messages: list[dict[str, Any]], hf_messages: list[dict[str, Any]], hf_args: dict[str, Any],
           **chat_args: Any) -> str:
    """chat() renders what HF renders (the text and its tokens, no special tokens added twice) and generates."""
    tokenizer = llm.get_tokenizer()
    expected = tokenizer.apply_chat_template(hf_messages, tokenize=False, **hf_args)
    given = copy.deepcopy(messages)
    (out,) = llm.chat(messages, GREEDY, use_tqdm=False, **chat_args)
    assert messages == given  # the caller's conversation is not rewritten
    assert out.prompt == expected
    assert out.prompt_token_ids == tokenizer.encode(expected, add_special_tokens=False)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens
    return expected


def test_model_template_with_and_without_a_generation_prompt(llm):
    opened = _check(llm, CONVERSATION, CONVERSATION, {"add_generation_prompt": True})
    closed = _check(llm, CONVERSATION, CONVERSATION, {"add_generation_prompt": False}, add_generation_prompt=False)
    assert opened.startswith(closed) and opened != closed


def test_continue_final_message_leaves_the_last_message_open(llm):
    messages = [*CONVERSATION, {"role": "assistant", "content": "The Argo"}]
    text = _check(llm, messages, messages, {"add_generation_prompt": False, "continue_final_message": True},
                  add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("The Argo")


def test_both_prompt_endings_are_refused_as_vllm_does(llm):
    messages = [*CONVERSATION, {"role": "assistant", "content": "The Argo"}]
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        llm.chat(messages, GREEDY, use_tqdm=False, continue_final_message=True)


@pytest.mark.parametrize("via_kwargs", [False, True])
def test_a_callers_template_gets_tools_variables_and_tool_call_arguments(llm, via_kwargs):
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}}
    messages = [*CONVERSATION, {"role": "assistant", "content": "", "tool_calls": [call]}]
    hf_messages = copy.deepcopy(messages)
    hf_messages[-1]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}  # templates serialise arguments
    template_args = ({"chat_template_kwargs": {"chat_template": PROBE_TEMPLATE, "mood": "calm"}} if via_kwargs else
                     {"chat_template": PROBE_TEMPLATE, "chat_template_kwargs": {"mood": "calm"}})
    text = _check(llm, messages, hf_messages, {"chat_template": PROBE_TEMPLATE, "tools": [WEATHER], "mood": "calm",
                                               "add_generation_prompt": True},
                  tools=[WEATHER], **template_args)
    assert text.startswith("[tools: weather][mood: calm]<system>") and "(call weather city=Oslo)" in text


@pytest.mark.parametrize("content_format", ["auto", "openai"])
def test_content_reaches_a_parts_template_as_openai_parts(llm, content_format):
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in CONVERSATION]
    text = _check(llm, CONVERSATION, parts, {"chat_template": PARTS_TEMPLATE, "add_generation_prompt": True},
                  chat_template=PARTS_TEMPLATE, chat_template_content_format=content_format)
    assert "[text:Name a ship.]" in text


def test_string_format_joins_a_parts_content(llm):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Name"}, {"type": "text", "text": "a ship."}]}]
    joined = [{"role": "user", "content": "Name\na ship."}]
    _check(llm, messages, joined, {"add_generation_prompt": True}, chat_template_content_format="string")


def test_renderer_arguments_are_not_template_variables(llm):
    with pytest.raises(ValueError, match="tokenize"):
        llm.chat(CONVERSATION, GREEDY, use_tqdm=False, chat_template_kwargs={"tokenize": True})

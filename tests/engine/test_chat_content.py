"""vLLM's chat template content format: which templates get OpenAI's content parts (auto detection), and the
content in each form."""

from __future__ import annotations

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flotilla.engine.chat_content import (
    detect_content_format,
    model_content_format,
    template_messages,
)

PARTS = "{% for message in messages %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}"


def _format(source: str) -> str:
    return detect_content_format(ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source))


@pytest.mark.parametrize("source", [
    PARTS,
    "{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}",
    # a variable set from messages (a slice), a filter on the loop, content under a filter: all seen through
    "{% set rest = messages[1:] %}{% for m in rest %}{% for c in m['content'] | selectattr('type', 'equalto', "
    "'text') %}{{ c['text'] }}{% endfor %}{% endfor %}",
    "{% set a = messages %}{% set b = a | list %}{% for m in b | reverse %}{% for c in m.content %}{% break %}"
    "{% endfor %}{% endfor %}",
    # Qwen2-VL's shape: strings and part lists both handled, the loop decides
    "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{{ c.text }}{% endfor %}{% endif %}{% endfor %}",
])
def test_a_template_that_loops_over_a_messages_content_gets_openai_parts(source):
    assert _format(source) == "openai"


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}",
    # a loop over something else's content, or over messages' own items, is not a message's content
    "{% for t in tools %}{% for c in t.content %}{{ c }}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for c in (m | first).content %}{{ c }}{% endfor %}{% endfor %}",
    # a shape vLLM's rule does not follow (a tuple target over messages): its default
    "{% for i, m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}",
])
def test_other_templates_get_a_string(source):
    assert _format(source) == "string"


def test_the_models_own_template_is_detected_and_a_given_format_wins(embedded_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)  # SmolLM2: `+ message['content'] +`
    assert model_content_format(tokenizer, "auto", None) == "string"
    assert model_content_format(tokenizer, "openai", None) == "openai"
    tokenizer.chat_template = PARTS
    assert model_content_format(tokenizer, "auto", None) == "openai"
    assert model_content_format(tokenizer, "string", None) == "string"


def test_content_in_each_form_as_vllm_passes_it():
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, {"type": "text"}]
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": parts},
                {"role": "assistant", "tool_calls": []}]
    assert [m["content"] for m in template_messages(messages, "string")] == ["hi", "a\nb", ""]
    assert [m["content"] for m in template_messages(messages, "openai")] == [
        [{"type": "text", "text": "hi"}], [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], []]
    assert template_messages(messages, "openai")[2]["tool_calls"] == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("source", [
    # variables set from each other in a cycle: the alias walk must end (it looped forever, growing, and the
    # model's own template is detected in the API process)
    "{% set a = messages %}{% set b = a %}{% set a = b %}{% for m in a %}{% for c in m.content %}{{ c.text }}"
    "{% endfor %}{% endfor %}",
    "{% set a = messages %}{% set b = a|list %}{% set c = b %}{% set a = c %}{{ a }}",
])
def test_variables_set_from_each_other_in_a_cycle_are_detected_once(source):
    assert _format(source) == ("openai" if "m.content" in source else "string")


def test_a_template_nested_past_the_recursion_limit_gets_a_string():
    import sys

    from jinja2 import nodes

    node: nodes.Expr = nodes.Name("messages", "load")
    for _ in range(sys.getrecursionlimit() + 10):  # deeper than Python recursion goes (jinja2's parser is iterative)
        node = nodes.Filter(node, "list", [], [], None, None)
    loop = nodes.For(nodes.Name("m", "store"), node, [], [], None, False)
    assert detect_content_format(nodes.Template([loop])) == "string"

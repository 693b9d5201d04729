"""Where a thinking request's grammar starts (structured_output/thinking.py) and the one reasoning parser the server and
the engine share (`--reasoning-parser` or --structured-outputs-config's `reasoning_parser`)."""

from __future__ import annotations

import pytest

from flotilla.engine.structured_output.thinking import ThinkingMarkers

START, END, X = 7, 8, 1
MARKERS = ThinkingMarkers(START, END)


@pytest.mark.parametrize("prompt, ended", [
    ([], False),  # no marker: the model may open the thinking itself (qwen3), so the grammar waits
    ([X, X], False),
    ([X, START, X], False),  # deepseek_r1's template opens <think>
    ([X, START, X, X, END, X], True),  # enable_thinking false: <think>\n\n</think>\n\n
    ([START, END, X, START], False),  # a later <think> opens the thinking again
    ([END], True),
])
def test_a_prompt_has_ended_its_thinking_when_its_last_marker_is_the_end(prompt, ended):
    assert MARKERS.ended(prompt) is ended


def test_the_server_and_the_engine_share_one_reasoning_parser():
    from flotilla.engine.config import EngineConfig, ServerConfig
    from flotilla.engine.server.cli import share_reasoning_parser

    from_flag = share_reasoning_parser(EngineConfig.from_kwargs(), ServerConfig.from_kwargs(reasoning_parser="qwen3"))
    assert from_flag[0].structured_outputs.reasoning_parser == from_flag[1].reasoning_parser == "qwen3"
    keyed = EngineConfig.from_kwargs(structured_outputs_config='{"reasoning_parser": "deepseek_r1"}')
    from_key = share_reasoning_parser(keyed, ServerConfig.from_kwargs())
    assert from_key[0].structured_outputs.reasoning_parser == from_key[1].reasoning_parser == "deepseek_r1"
    with pytest.raises(ValueError, match="differ"):
        share_reasoning_parser(keyed, ServerConfig.from_kwargs(reasoning_parser="qwen3"))


# qwen3's call opening (vLLM's Qwen3 parser): <tool_call>, whitespace, then <function= or <function .
@pytest.mark.parametrize("after, verdict", [
    ("\n<function=get_weather>", True), ("<function name=\"f\">", True), (" " * 16 + "<function=", True),
    ("", None), ("\n  ", None), ("\n<func", None), ("<function", None),
    ("\n{\"name\": \"f\"}", False),  # a hermes JSON call: not this rule's (vLLM's neither)
    (" is how a call opens", False), ("</tool_call>", False), ("<functions", False), (" " * 17 + "<function=", False),
])
def test_a_call_opening_is_tool_call_then_whitespace_then_function(after, verdict):
    from flotilla.engine.structured_output.thinking import call_follows

    assert call_follows(after) is verdict


@pytest.fixture(scope="module")
def qwen3_markers(embedded_model_dir):
    """The qwen3 parser's markers over the embedded tokenizer with Qwen's marker tokens added (as Qwen3's vocabulary
    has them), and a function that tokenizes text."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from flotilla.engine.structured_output.thinking import thinking_markers

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    tokenizer.add_tokens([AddedToken(t, special=False) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")])
    markers = thinking_markers(tokenizer, "qwen3")
    assert markers is not None and markers.calls is not None
    assert thinking_markers(tokenizer, "deepseek_r1").calls is None  # the rule is qwen3's alone
    return markers, lambda text: tokenizer.encode(text, add_special_tokens=False)


CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize("prompt, ended", [
    ("Hi<think>\n", False),
    ("Hi<think>\n\n</think>\n\n", True),
    ("Hi<think>\nI will call it.\n<tool_call>\n<function=get_weather>\n", True),  # an open call ends it
    ("Hi<think>\nI will write <tool_call> then the call.", False),  # a mention does not
    ("Tools, e.g. " + CALL + "\nHi<think>\n", False),  # a closed call (the tools' example) does not
    ("Tools, e.g. " + CALL + "\nHi<think>\nx<tool_call>\n<function=f>", True),
    ("<tool_call>\n<function=f>\n<think>\n", False),  # a <think> after the call opens the thinking again
    # other tool parsers' openers do not end it (vLLM's qwen3 parser neither): bare <function= (qwen3_coder without
    # its wrapper), hermes's JSON in <tool_call>, mistral's [TOOL_CALLS], llama3_json's <|python_tag|>
    ("Hi<think>\nx\n<function=f>\n<parameter=a>\n1\n", False),
    ('Hi<think>\nx<tool_call>\n{"name": "f", "arguments": {}}', False),
    ('Hi<think>\nx[TOOL_CALLS][{"name": "f", "arguments": {}}]', False),
    ('Hi<think>\nx<|python_tag|>{"name": "f", "parameters": {}}', False),
])
def test_a_qwen3_prompt_ends_its_thinking_at_an_open_call(qwen3_markers, prompt, ended):
    markers, encode = qwen3_markers
    assert markers.ended(encode(prompt)) is ended


def test_a_qwen3_grammar_starts_after_the_token_that_completes_the_call_opening(qwen3_markers):
    # Fed a token at a time, as the engine does: the thinking ends where `<function=` is complete, not before.
    markers, encode = qwen3_markers
    thinking = encode("I could write <tool_call> here. Now:")
    opening = encode("<tool_call>\n<function=")
    output = thinking + opening + encode("get_weather>")
    ends = [markers.end_in(output[:n], max(0, n - 1)) for n in range(1, len(output) + 1)]
    done = len(thinking) + len(opening) - 1  # the index of the token that completes `<function=`
    assert ends[:done] == [None] * done
    assert ends[done] == done


def test_a_qwen3_end_marker_before_a_call_ends_the_thinking_there(qwen3_markers):
    markers, encode = qwen3_markers
    output = encode("x</think>") + encode("<tool_call>\n<function=f>")
    assert markers.end_in(output, 0) == len(encode("x</think>")) - 1

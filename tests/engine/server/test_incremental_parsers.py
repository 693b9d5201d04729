"""The streamed parsers (reasoning, tool calls) parse each step's news only, and give the whole text's parse: the
same text fed in one piece, one character at a time and in random pieces sends the same thinking, answer and calls,
and a step reads no more than its new text and a tail shorter than a marker."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.server.reasoning import END, START, ReasoningParser, ReasoningStream
from flotilla.engine.server.sse import ChunkFormat
from flotilla.engine.server.tool_calls import ToolPlan, chat_message
from flotilla.engine.server.tool_parsers.registry import PARSERS, tool_parser
from flotilla.engine.server.tool_stream import stream_tool_chat

_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
_LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'

REASONING_TEXTS = [
    "", " ", "\n\n", "<", "<thi", "<think", START, END, "  <thi", "<think>\n", "plain answer", "  spaced answer",
    "<think>Hmm.</think>\n\nYes.", "  <think>\nx</think>y", "abc</think>answer", "abc</thi",
    "<think>a</think>b</think>c", "<think><think>x</think>",
    "a<b</</think>\n\n\nc\n", "<think>x</think>\n", "<thinking>no</think>", "<>think",
]

TOOL_TEXTS = [
    "", " ", "Sure.", "<", "<tool_", "<tool_call", "Let me check.\n<tool_call>\n" + _CALL + "\n</tool_call>",
    "<tool_call>" + _CALL + "</tool_call><tool_call>" + _CALL, "a <tool_ b <tool_call>{bad", "[TOOL", "[TOOL_CALLS]",
    "Sure. [TOOL_CALLS][" + _CALL + "]", "x [TOOL_CALL [TOOL_CALLS] [" + _CALL + "]", "  {", "{" + _LLAMA_CALL[1:],
    "<|python_tag|>" + _LLAMA_CALL + "; " + _LLAMA_CALL, "  \n <|python", "<|python_ta x", "  It is sunny.", "<|pyt{",
    "Ok.\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>", "x <functi", "a <function=f> b <tool_call>",
]

_FRAGMENTS = ["<", ">", "think", "</", START, END, "<thi", "</thin", "<tool_call>", "<tool_", "</tool_call>",
              "[TOOL_CALLS]", "[TOOL", "<|python_tag|>", "<|py", "{", "}", _CALL, " ", "\n", "a", "b", "Yes."]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 12))) for _ in range(count)]


def _splits(text: str, seed: int) -> dict[str, list[str]]:
    """The text whole, one character at a time, and in random pieces (empty ones included, as a step that added
    no text)."""
    rng = random.Random(seed)
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return {"whole": [text], "chars": list(text) or [""], "random": pieces}


# qwen3's call opening ends its thinking (<tool_call>, whitespace, <function= or <function ); pieces of one.
_CALL_FRAGMENTS = ["<tool_call>", "<tool_", "<function=", "<function", "<func", " ", "\n", "x", END, START, "f>",
                   " " * 9, "{"]
REASONING_CALL_TEXTS = [
    "<think>Let me check.<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
    "Hmm <tool_call> is a tag.</think>\n\nAnswer.", "a<tool_call>\n" + " " * 20 + "<function=f>", "<tool_call>",
    "x<tool_call>\n<func", "x<tool_call><tool_call><function name=\"f\">", "<think>a<tool_call>{\"name\": 1}</think>b",
]
# Thinking that writes the call opening of another --tool-call-parser than qwen3_coder's wrapped one: no end.
_OTHER_OPENERS = [
    "Let me check.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    "Let me check.[TOOL_CALLS][" + _CALL + "]", "Let me check.<|python_tag|>" + _LLAMA_CALL, _LLAMA_CALL,
    "Let me check.\n<tool_call>\n" + _CALL + "\n</tool_call>",
]


def _random_call_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_CALL_FRAGMENTS) for _ in range(rng.randint(1, 14))) for _ in range(count)]


@pytest.mark.parametrize("name, opened", [("deepseek_r1", False), ("qwen3", False), ("qwen3", True)])
@pytest.mark.parametrize("text", REASONING_TEXTS + REASONING_CALL_TEXTS + _OTHER_OPENERS + _random_texts(60, seed=1)
                         + _random_call_texts(60, seed=3))
def test_reasoning_stream_sends_the_whole_texts_split_whatever_the_steps(name, opened, text):
    parser = ReasoningParser(name, opened=opened)
    whole = parser.split(text)
    for how, pieces in _splits(text, seed=len(text)).items():
        stream = ReasoningStream(parser)
        parts = [stream.feed(p, finished=i == len(pieces) - 1) for i, p in enumerate(pieces)]
        got = ("".join(s.reasoning or "" for s in parts), "".join(s.content or "" for s in parts))
        assert got == (whole.reasoning or "", whole.content or ""), how


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("text", TOOL_TEXTS + _random_texts(60, seed=2))
def test_tool_stream_sends_the_whole_texts_safe_prefix_at_every_step(name, text):
    """After each step, the content sent is `safe_prefix` of the text so far (its whole-text definition), and the
    stream keeps the whole text for the final parse."""
    parser = tool_parser(name)
    for how, pieces in _splits(text, seed=len(text) + 1).items():
        stream, sent, so_far = parser.stream(), "", ""
        for piece in pieces:
            so_far += piece
            sent += stream.feed(piece)
            assert sent == so_far[: parser.safe_prefix(so_far)] and stream.sent == len(sent), (how, so_far)
        assert stream.text == text


def _deltas(text: str, pieces: list[str]) -> list[RequestOutput]:
    return [RequestOutput("r", None, [1, 2, 3], outputs=[CompletionOutput(
        0, p, [i], finish_reason="stop" if i == len(pieces) - 1 else None)], finished=i == len(pieces) - 1)
        for i, p in enumerate(pieces)]


def _streamed_message(plan: ToolPlan, reasoning: ReasoningParser | None, text: str, pieces: list[str]) -> tuple:
    """A chat stream's thinking, content, calls (name, arguments) and finish_reason."""
    async def gen():
        for o in _deltas(text, pieces):
            yield o

    async def collect():
        fmt = ChunkFormat("chatcmpl-1", "chat.completion.chunk", 0, "m")
        return [c async for c in stream_tool_chat(plan, reasoning, 1, gen(), fmt, None)]

    events = [e for c in asyncio.run(collect())[:-1] for e in c.split("\n\n") if e]
    choices = [json.loads(e.removeprefix("data: "))["choices"][0] for e in events]
    deltas = [c["delta"] for c in choices[1:]]  # after the role chunk
    calls = [(c["function"]["name"], c["function"]["arguments"]) for d in deltas for c in d.get("tool_calls", [])]
    return ("".join(d.get("reasoning") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas),
            calls, choices[-1]["finish_reason"])


@pytest.mark.parametrize("reasoning", [None, "deepseek_r1", "qwen3"])
@pytest.mark.parametrize("mode, parser", [("none", None), ("required", None), ("auto", "hermes"),
                                          ("auto", "mistral"), ("auto", "llama3_json")])
def test_chat_stream_matches_the_non_streamed_message_whatever_the_steps(reasoning, mode, parser):
    plan = ToolPlan(mode, [], parser=tool_parser(parser) if parser else None)
    thinker = ReasoningParser(reasoning) if reasoning else None
    texts = ["<think>Need it.</think>\n\nChecking.\n<tool_call>\n" + _CALL + "\n</tool_call>",
             "\n \n<tool_call>" + _CALL + "</tool_call>", " \n[TOOL_CALLS][" + _CALL + "]", "  \n",
             "Thinking</think>Sure. [TOOL_CALLS][" + _CALL + "]", "<|python_tag|>" + _LLAMA_CALL,
             '[{"name": "get_weather", "parameters": {"city": "Paris"}}]', "<think>x</think>Just text."]
    for text in texts:
        message, finish = chat_message(plan, text, "stop", thinker)
        whole_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        for how, pieces in _splits(text, seed=7).items():
            thought, content, calls, streamed_finish = _streamed_message(plan, thinker, text, pieces)
            assert thought == (message.get("reasoning") or ""), how
            assert content == (message["content"] or ""), how
            assert [(n, json.loads(a)) for n, a in calls] == [(n, json.loads(a)) for n, a in whole_calls], how
            assert streamed_finish == finish, how


def _long_text(size: int) -> str:
    """Thinking and then an answer full of near-misses of every marker (no marker completes until the end)."""
    noise = "a <thi b </thin c <tool_ d [TOOL_CALL e <|python_ f <functio g \n"
    body = (noise * (size // len(noise) + 1))[:size]
    return f"{START}{body}{END}\n\n{body}"


@pytest.mark.parametrize("step", [1, 5, 64])
def test_each_steps_parsing_reads_its_news_and_a_bounded_tail(step):
    """Characters read per step stay within the step's new text plus marker-sized tails, however long the output
    (the parsers used to re-read the whole text each step: a 20,000-character output read ~10^8 characters)."""
    text = _long_text(10_000)
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    slack = 2 * (len(START) + len(END) + len("<|python_tag|>"))
    thinker = ReasoningStream(ReasoningParser("qwen3"))
    answers = {name: tool_parser(name).stream() for name in sorted(PARSERS)}
    for piece in pieces[:-1]:  # the last step parses the whole answer once (the calls)
        before = thinker.scanned
        answer = thinker.feed(piece).content or ""
        assert thinker.scanned - before <= 2 * len(piece) + slack
        for name, stream in answers.items():
            before = stream.scanned
            stream.feed(answer)
            assert stream.scanned - before <= len(answer) + slack, name
    assert thinker.scanned < 3 * len(text)  # linear in the output, where a re-read per step is quadratic


def _response_events(plan: ToolPlan, reasoning: ReasoningParser | None, pieces: list[str]) -> list[dict]:
    from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing, _response

    req = ResponsesRequest(input="x", stream=True, store=False)

    async def gen():
        for o in _deltas("".join(pieces), pieces):
            yield o

    async def collect():
        serving = ResponsesServing(serving=None)  # type: ignore[arg-type]  # _events needs no engine
        return [e async for e in serving._events(req, _response(req, "resp_1", "m"), plan, reasoning, gen(), [])]

    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]


def _without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


def _streamed_items_add_up(events: list[dict], items: list[dict]) -> None:
    """Each item's deltas add up to its finished text, at its output index."""
    for index, item in enumerate(items):
        of_item = [e for e in events if e.get("item_id", e.get("item", {}).get("id")) == item["id"]]
        assert all(e["output_index"] == index for e in of_item)
        kind, text = {"message": ("response.output_text.delta", lambda i: i["content"][0]["text"]),
                      "reasoning": ("response.reasoning_text.delta", lambda i: i["content"][0]["text"]),
                      "function_call": ("response.function_call_arguments.delta", lambda i: i["arguments"])}[
            item["type"]]
        assert "".join(e["delta"] for e in of_item if e["type"] == kind) == text(item)
        assert [e["item"]["type"] for e in of_item if e["type"] == "response.output_item.done"] == [item["type"]]


@pytest.mark.parametrize("reasoning", [None, "deepseek_r1", "qwen3"])
@pytest.mark.parametrize("mode, parser, function", [("none", None, None), ("required", None, None),
                                                    ("auto", "hermes", None), ("auto", "mistral", None),
                                                    ("auto", "llama3_json", None), ("named", None, "get_weather")])
def test_responses_stream_reads_deltas_and_sends_the_same_items_whatever_the_steps(reasoning, mode, parser,
                                                                                    function):
    """The Responses stream takes delta outputs: its deltas add up to the finished items (a reasoning item first when
    there was thinking), which are the same however the text was cut into steps, and its usage counts every step's
    tokens."""
    from flotilla.engine.server.responses import _reply_items

    plan = ToolPlan(mode, [], parser=tool_parser(parser) if parser else None, function=function)
    thinker = ReasoningParser(reasoning) if reasoning and mode in ("none", "auto") else None  # as served: no grammar
    texts = ["Checking.\n<tool_call>\n" + _CALL + "\n</tool_call>", "Sure. [TOOL_CALLS][" + _CALL + "]",
             "<|python_tag|>" + _LLAMA_CALL, '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
             '{"city": "Paris"}', "Just text, <tool_ no call.", "<think>Hmm.</think>\n\nSure. [TOOL_CALLS][" + _CALL +
             "]", "All thinking</think>\n\n<tool_call>" + _CALL + "</tool_call>", "<think>only thinking",
             " \n<tool_call>" + _CALL + "</tool_call>", "Text.\n \n[TOOL_CALLS][" + _CALL + "]", "  \n"]
    for text in texts:
        outputs = []
        for how, pieces in _splits(text, seed=3).items():
            events = _response_events(plan, thinker, pieces)
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            response = events[-1]["response"]
            assert response["usage"]["output_tokens"] == len(pieces), how
            _streamed_items_add_up(events, response["output"])
            outputs.append(_without_ids(response["output"]))
        assert outputs[0] == outputs[1] == outputs[2], text
        assert _without_ids(_reply_items(plan, thinker, _deltas(text, [text])[0], None)) == outputs[0], text
        if thinker is not None:
            thought = thinker.split(text).reasoning
            assert [i["content"][0]["text"] for i in outputs[0] if i["type"] == "reasoning"] == (
                [thought] if thought else [])


_XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize("name, opened, text, reasoning, content", [
    # qwen3: a call opening ends the thinking; the answer (the tool parser's text) starts at its <tool_call>
    ("qwen3", False, "<think>Let me check.\n" + _XML_CALL, "Let me check.\n", _XML_CALL),
    ("qwen3", True, "Let me check.\n" + _XML_CALL, "Let me check.\n", _XML_CALL),
    ("qwen3", True, "A <tool_call> is a tag.\n" + _XML_CALL, "A <tool_call> is a tag.\n", _XML_CALL),
    ("qwen3", True, "Mention <tool_call> only.</think>\n\nYes.", "Mention <tool_call> only.", "Yes."),
    ("qwen3", True, 'JSON: <tool_call>\n{"name": "f"}', 'JSON: <tool_call>\n{"name": "f"}', None),  # not XML
    ("qwen3", True, "Done.</think>\n\n" + _XML_CALL, "Done.", _XML_CALL),
    # the prompt opened the thinking: the output is thinking until its end, as deepseek_r1's (vLLM's qwen3 parser)
    ("qwen3", True, "Hmm.</think>\n\nYes.", "Hmm.", "Yes."),
    ("qwen3", True, "Still thinking", "Still thinking", None),
    ("qwen3", False, "No think tag: all answer", None, "No think tag: all answer"),
    ("deepseek_r1", False, "Let me check.\n" + _XML_CALL, "Let me check.\n" + _XML_CALL, None),  # qwen3's rule alone
    # the other tool parsers' openers stay thinking, as in vLLM's qwen3 parser (its rule is that one opening, whatever
    # --tool-call-parser is): a bare <function= (qwen3_coder's call without its wrapper), [TOOL_CALLS] (mistral),
    # <|python_tag|> or a JSON object (llama3_json), a <tool_call> with JSON (hermes, above)
    *[("qwen3", True, text, text, None) for text in _OTHER_OPENERS],
])
def test_qwen3_thinking_ends_at_a_call_opening(name, opened, text, reasoning, content):
    split = ReasoningParser(name, opened=opened).split(text)
    assert (split.reasoning, split.content) == (reasoning, content)

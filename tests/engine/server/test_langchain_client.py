"""LangChain's ChatOpenAI against the server, as vLLM users run it (issue 24): the default chat path
with OpenAI's `store`, `metadata` and `parallel_tool_calls` set, and `use_responses_api`."""

from __future__ import annotations

import pytest

from .conftest import API_KEY

langchain_openai = pytest.importorskip("langchain_openai")

QUESTION = "Which harbour is the oldest?"


def _expected(client, max_tokens: int) -> str:
    answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=max_tokens, temperature=0)
    return answer.choices[0].message.content


def _chat_model(server, **kwargs):
    return langchain_openai.ChatOpenAI(model="tiny", base_url=f"{server.url}/v1", api_key=API_KEY, temperature=0,
                                       max_retries=0, **kwargs)


def test_default_path_with_openai_fields_set(server, client):
    # LangChain's own `metadata` is run metadata; OpenAI's request field goes in the body.
    model = _chat_model(server, max_tokens=6, store=False, model_kwargs={"parallel_tool_calls": False},
                        extra_body={"metadata": {"team": "harbour"}})
    answer = model.invoke(QUESTION)
    assert answer.content == _expected(client, 6)
    assert answer.response_metadata["token_usage"]["completion_tokens"] == 6
    log = server.log.read_text()
    # parallel_tool_calls is a field the server knows (tool calling): only the other two are ignored.
    assert "ignored: ['metadata', 'store']" in log


def test_streaming_default_path(server, client):
    model = _chat_model(server, max_tokens=5, streaming=True)
    assert "".join(chunk.content for chunk in model.stream(QUESTION)) == _expected(client, 5)


def test_use_responses_api(server, client):
    model = _chat_model(server, max_tokens=6, use_responses_api=True)
    answer = model.invoke(QUESTION)
    assert answer.text == _expected(client, 6)

"""Requests that vLLM's OpenAI server serves, sent as vLLM users' clients send them (the real `openai` client on
the shared tiny server), and the answers' forms those clients read."""

from __future__ import annotations

import httpx

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "hi"}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)


def test_explicit_nulls_that_vllm_takes_as_unset_are_served(server, client):
    # The SDK sends an argument given as None as JSON null; vLLM declares these fields optional (None = unset).
    completion = client.completions.create(model="tiny", prompt="hi", max_tokens=2, presence_penalty=None,
                                           frequency_penalty=None, echo=None, stream=None,
                                           extra_body={"return_tokens_as_token_ids": None})
    assert completion.choices[0].text and not completion.choices[0].text.startswith("hi")
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, presence_penalty=None,
                                          frequency_penalty=None, logprobs=None, n=None, stream=None,
                                          extra_body={"return_tokens_as_token_ids": None})
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None


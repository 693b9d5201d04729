"""Mixture-of-experts models through the real server with the real `openai` client: the tiny Mixtral and Qwen3-MoE
answer completions (several prompts in one request, so their steps batch) and a streamed chat with HF's greedy
tokens."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from openai import OpenAI

from tests.engine.hf_reference import hf_greedy
from tests.engine.server.conftest import API_KEY, Server, start_tiny_server, stop_server

MAX_TOKENS = 10


@pytest.fixture(scope="module", params=["mixtral", "qwen3-moe"])
def moe_server(request, tiny_model_dirs, tmp_path_factory) -> Iterator[tuple[str, Server]]:
    arch = request.param
    s = start_tiny_server(tiny_model_dirs[arch], tmp_path_factory.mktemp(f"{arch}-server") / "server.log")
    yield arch, s
    stop_server(s)


def _client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def test_completions_of_several_prompts_match_hf(moe_server, tiny_model_dirs):
    arch, server = moe_server
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 49152) for _ in range(rng.randint(4, 30))] for _ in range(3)]
    reply = _client(server).completions.create(model="tiny", prompt=prompts, max_tokens=MAX_TOKENS, temperature=0,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
    got = [c.model_extra["token_ids"] for c in sorted(reply.choices, key=lambda c: c.index)]
    assert got == hf_greedy(tiny_model_dirs[arch], prompts, MAX_TOKENS)
    assert reply.usage.completion_tokens == 3 * MAX_TOKENS


def test_a_streamed_chat_matches_hf(moe_server, tiny_model_dirs):
    from transformers import AutoTokenizer

    arch, server = moe_server
    path = tiny_model_dirs[arch]
    messages = [{"role": "user", "content": "Which expert answers this?"}]
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = tokenizer.decode(hf_greedy(path, [list(prompt)], MAX_TOKENS)[0], skip_special_tokens=True)
    stream = _client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert expected and text == expected

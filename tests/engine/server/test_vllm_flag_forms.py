"""Flag values in the forms `vllm serve` takes, given to the real server."""

from __future__ import annotations

import openai
import pytest

from .conftest import API_KEY


@pytest.fixture
def short_server(flags_server):
    """The tiny Llama with its context and step budget in vLLM's human-readable form: 0.4k = 400 tokens
    (lower-case suffixes are powers of 1,000), 1K = 1,024 (upper-case ones powers of 1,024); its weights
    read with vLLM's --load-format safetensors (the session's `flags_server`, conftest.py)."""
    return flags_server


def test_max_model_len_in_vllms_human_readable_form(short_server):
    client = openai.OpenAI(base_url=f"{short_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    assert [m.max_model_len for m in client.models.list().data] == [400]
    prompt = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=1).usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="maximum context length is 400 tokens"):
        client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=401 - prompt)
    out = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=400 - prompt,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.total_tokens == 400


def test_load_format_safetensors_serves_the_checkpoint(short_server, client):
    """vLLM's --load-format safetensors reads the same weights as auto: the shared server's greedy tokens."""
    short = openai.OpenAI(base_url=f"{short_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    kwargs = dict(model="tiny", prompt="Once upon a time in a harbour", max_tokens=12, temperature=0)
    assert short.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text

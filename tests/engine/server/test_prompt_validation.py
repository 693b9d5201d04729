"""One prompt rule, the engine's: checked against the model's vocabulary, which may be padded past the
tokenizer's, and answered as a 400 with OpenAI's error JSON, streaming or not."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .conftest import API_KEY, Server, start_tiny_server, stop_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PADDING = 64  # models pad their embedding to a multiple of 64 or 128 beyond the tokenizer's entries


@pytest.fixture(scope="module")
def padded(tiny_model_dirs, tmp_path_factory) -> Iterator[tuple[Server, int, int]]:
    """A tiny Llama whose vocabulary is the tokenizer's plus 64 padding entries."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = tiny_model_dirs["llama"]
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    config.vocab_size = len(tokenizer) + PADDING
    torch.manual_seed(7)
    path = tmp_path_factory.mktemp("padded") / "llama"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    server = start_tiny_server(path, path.parent / "server.log")
    yield server, len(tokenizer), config.vocab_size
    stop_server(server)


def _complete(server: Server, prompt: list[int] | str, stream: bool = False) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "stream": stream}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)


@pytest.mark.parametrize("stream", [False, True])
def test_ids_in_the_padding_are_the_models_to_accept(padded, stream):
    server, tokenizer_len, vocab = padded
    # Valid for the model (its embedding has rows for them), unknown to the tokenizer.
    response = _complete(server, [5, tokenizer_len, vocab - 1], stream)
    assert response.status_code == 200, response.text
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ("vocab", "outside the vocabulary (size"),
        ([-1], "outside the vocabulary (size"),
        ("word " * 400, "maximum context length is 256 tokens"),
        ([7] * 256, "maximum context length is 256 tokens"),
    ],
)
def test_a_prompt_the_engine_refuses_is_a_400_before_any_stream_starts(padded, stream, prompt, fragment):
    server, _, vocab = padded
    response = _complete(server, [vocab] if prompt == "vocab" else prompt, stream)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "BadRequestError" and error["param"] == "prompt"
    assert server.metric("vllm:num_requests_running") == 0 and server.metric("vllm:kv_cache_usage_perc") == 0


def test_detokenize_takes_the_models_vocabulary(padded):
    server, tokenizer_len, vocab = padded
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [tokenizer_len, vocab - 1]},
                      headers=AUTH).status_code == 200
    refused = httpx.post(f"{server.url}/detokenize", json={"tokens": [vocab]}, headers=AUTH)
    assert refused.status_code == 400 and f"[0, {vocab})" in refused.json()["error"]["message"]

"""The server applies generation_config.json's sampling fields to requests that leave them out
(`--generation-config auto`, vLLM's default), with `--override-generation-config` set over them, and a
request's own values still win."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
import torch

from .conftest import API_KEY, Server, start_tiny_server, stop_server

PROMPT = [5, 17, 230, 4000, 12, 9, 77, 301]
MODEL_DEFAULTS = {"do_sample": True, "top_k": 1, "repetition_penalty": 5.0, "max_new_tokens": 40, "temperature": 0.7}
# vLLM's --override-generation-config: generation_config.json's names, set over the file's values
OVERRIDE = {"max_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def gen_server(tiny_model_dirs, tmp_path_factory) -> Iterator[tuple[Server, object]]:
    root = tmp_path_factory.mktemp("gen-config-server")
    model = shutil.copytree(tiny_model_dirs["llama"], root / "llama")
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(gen | MODEL_DEFAULTS))
    s = start_tiny_server(model, root / "server.log", "--override-generation-config", json.dumps(OVERRIDE))
    yield s, model
    stop_server(s)


def _hf_generate(path, prompt: list[int], max_new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        x = torch.tensor([prompt])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens)
        return out[0, len(prompt):].tolist()


def test_requests_without_sampling_fields_take_the_model_defaults(gen_server):
    import httpx

    server, model = gen_server
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "tiny", "prompt": PROMPT, "logprobs": 0, "return_tokens_as_token_ids": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    tokens = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    # top_k 1 with the file's repetition penalty; 12 tokens: the override's max_new_tokens, not the file's 40
    assert tokens == _hf_generate(model, PROMPT, OVERRIDE["max_new_tokens"])
    # vLLM's override_max_tokens: the override's max_new_tokens bounds a request's own max_tokens too
    capped = httpx.post(f"{server.url}/v1/completions", json=body | {"max_tokens": 30, "ignore_eos": True},
                        headers=headers, timeout=60).json()
    assert capped["usage"]["completion_tokens"] == OVERRIDE["max_new_tokens"], capped
    own = httpx.post(f"{server.url}/v1/completions", json=body | {"max_tokens": 3, "top_k": 0, "temperature": 0.0,
                                                                    "repetition_penalty": 1.0},
                     headers=headers, timeout=60).json()["choices"][0]
    assert own["finish_reason"] == "length" and len(own["logprobs"]["tokens"]) == 3


def test_the_override_applies_with_generation_config_vllm_too(tmp_path):
    from flotilla.engine.generation_defaults import default_sampling_fields

    (tmp_path / "generation_config.json").write_text(json.dumps(MODEL_DEFAULTS))
    override = {"temperature": 0.25, "max_new_tokens": 7, "do_sample": True, "top_p": None}
    # vllm: the file is not read, the override still is (vLLM's get_diff_sampling_param); keys beyond the six
    # sampling fields, and null values, are ignored
    assert default_sampling_fields("vllm", str(tmp_path), override) == {"temperature": 0.25, "max_tokens": 7}
    assert default_sampling_fields("auto", str(tmp_path), override) == {
        "top_k": 1, "repetition_penalty": 5.0, "temperature": 0.25, "max_tokens": 7}

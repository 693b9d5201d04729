"""LoRA through a real `flotilla serve` and the real `openai` client: adapters chosen by `model`,
listed with their parent, loaded and unloaded at runtime, unknown names answered 404, and
`vllm:lora_requests_info` on /metrics."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from ..server.conftest import start_server, stop_server
from .peft_reference import peft_greedy

PROMPT = [5, 9, 200, 3000, 77, 1234, 42, 8, 99, 1000]


@pytest.fixture(scope="module")
def lora_server(tiny_model_dirs, lora_adapters, tmp_path_factory):
    adapters = lora_adapters["qwen3"]
    json_form = json.dumps({"name": "attn", "path": str(adapters["attn"]), "base_model_name": "tiny"})
    s = start_server(
        tiny_model_dirs["qwen3"], tmp_path_factory.mktemp("lora-server") / "server.log",
        "--served-model-name", "tiny", "--max-model-len", "128", "--disable-log-stats",
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
        "--lora-modules", f"all7={adapters['all7']}", json_form,
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    )
    yield s
    stop_server(s)


@pytest.fixture
def client(lora_server):
    return openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="none", max_retries=0)


def _greedy(client, model: str) -> str:
    reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.model == model
    return reply.choices[0].text


def _oracle_text(model_dir, adapter) -> str:
    from transformers import AutoTokenizer

    tokens = peft_greedy(model_dir, adapter, [PROMPT], 6)[0]
    return AutoTokenizer.from_pretrained(model_dir).decode(tokens, skip_special_tokens=True)


def test_models_lists_adapters_with_their_parent(client, lora_adapters):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "all7", "attn"}
    assert models["all7"].parent == "tiny" and models["attn"].parent == "tiny"
    assert models["all7"].root == str(lora_adapters["qwen3"]["all7"])
    assert models["tiny"].parent is None


def test_each_adapter_answers_as_peft_does(client, tiny_model_dirs, lora_adapters):
    model_dir = tiny_model_dirs["qwen3"]
    for name, adapter in (("tiny", None), ("all7", lora_adapters["qwen3"]["all7"])):
        assert _greedy(client, name) == _oracle_text(model_dir, adapter), name


def test_unknown_adapter_is_a_404_openai_error(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)
    assert "no-such-adapter" in err.value.message


def test_runtime_load_and_unload(client, lora_server, tiny_model_dirs, lora_adapters):
    url, path = lora_server.url, str(lora_adapters["qwen3"]["mlp"])
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": path}, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert "mlp" in {m.id for m in client.models.list().data}
    assert _greedy(client, "mlp") == _oracle_text(tiny_model_dirs["qwen3"], path)
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": path}, timeout=60)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "mlp"}, timeout=60)
    assert gone.status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="mlp", prompt="hi", max_tokens=2)
    missing = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "mlp"}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"


def test_a_bad_adapter_directory_is_refused_with_an_error(lora_server, tmp_path):
    url = lora_server.url
    nowhere = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
    assert nowhere.status_code == 404
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "use_dora": True}))
    dora = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
    assert dora.status_code == 400 and "use_dora" in dora.json()["error"]["message"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_lora_requests_info_metric(client, lora_server):
    _greedy(client, "attn")
    lines = [line for line in httpx.get(f"{lora_server.url}/metrics").text.splitlines()
             if line.startswith("vllm:lora_requests_info{")]
    assert lines and all('max_lora="2"' in line for line in lines)
    assert all("running_lora_adapters=" in line and "waiting_lora_adapters=" in line for line in lines)


def test_lora_requests_info_keeps_one_series_whatever_adapters_clients_pick(client, lora_server):
    # Each distinct (waiting, running) adapter list made a series of its own, kept forever: clients choosing
    # adapters (and, with runtime loading, their names) grew /metrics and Prometheus' series without bound. As the
    # gauge's value is the update's time, only the latest series means anything: it is the one kept.
    for models in (["attn"], ["all7"], ["attn", "all7"], ["tiny", "all7"]):
        with ThreadPoolExecutor(len(models)) as pool:
            list(pool.map(lambda m: _greedy(client, m), models))
    lines = [line for line in httpx.get(f"{lora_server.url}/metrics").text.splitlines()
             if line.startswith("vllm:lora_requests_info{")]
    assert len(lines) == 1, lines


def test_unloading_an_adapter_while_a_stream_uses_it(client, lora_server, lora_adapters):
    # The stream goes on with the adapter's weights to its end (they are read again from its directory if its
    # slot was freed); new requests for the name get 404 at once.
    url, path = lora_server.url, str(lora_adapters["qwen3"]["mlp"])
    assert httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "busy", "lora_path": path}).status_code == 200
    body = {"model": "busy", "prompt": PROMPT, "max_tokens": 60, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**body).choices[0].text
    stream = client.completions.create(**body, stream=True)
    pieces = [next(iter(stream)).choices[0].text]
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "busy"}, timeout=60)
    assert gone.status_code == 200, gone.text
    pieces += [c.choices[0].text for c in stream]
    assert "".join(pieces) == whole
    with pytest.raises(openai.NotFoundError):
        client.completions.create(**{**body, "max_tokens": 1})
    # Nor may an adapter take the base model's name.
    clash = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "tiny", "lora_path": path})
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "lora_name", clash.text

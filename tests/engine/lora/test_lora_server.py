"""LoRA through a real `flotilla serve` and the real `openai` client: adapters chosen by `model`,
listed with their parent, loaded and unloaded at runtime, unknown names answered 404, and
`vllm:lora_requests_info` on /metrics."""

from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    # as vLLM's adapter cards: no max_model_len, the same permission entry as the base model's
    assert models["all7"].max_model_len is None and models["all7"].permission[0]["allow_sampling"] is True


def test_retrieving_an_adapter_gives_its_card_as_the_list_does(client):
    """GET /v1/models/{id} of an adapter is its own card (root its directory, parent the base), the list's entry.
    Before: the base model's card under the adapter's name (root the base's directory, parent null)."""
    listed = {m.id: m.model_dump(exclude={"permission", "created"}) for m in client.models.list().data}
    for name in ("all7", "attn", "tiny"):
        assert client.models.retrieve(name).model_dump(exclude={"permission", "created"}) == listed[name], name


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


@pytest.mark.parametrize("name", ["n" * 257, "line\nbreak", "x" * 100_000])
def test_an_adapter_name_too_long_or_with_control_characters_is_a_400(client, lora_server, lora_adapters, name):
    # Names appear in /v1/models, in the vllm:lora_requests_info label and in the logs: a 100 KB name (or one with
    # a newline, forging log lines) was served as given. Bound: 256 characters, printable.
    url, path = lora_server.url, str(lora_adapters["qwen3"]["mlp"])
    refused = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora_name", refused.text[:300]
    assert name.strip() not in {m.id for m in client.models.list().data}
    longest = "n" * 256
    fits = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": longest, "lora_path": path}, timeout=60)
    assert fits.status_code == 200, fits.text
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": longest}, timeout=60).status_code == 200


def test_a_long_lora_modules_name_is_a_usage_error():
    from flotilla.engine.lora.registry import parse_lora_module

    with pytest.raises(ValueError, match="256"):
        parse_lora_module("n" * 257 + "=/some/dir")
    assert parse_lora_module("n" * 256 + "=/some/dir").name == "n" * 256


def _core_peak_rss_bytes(server) -> int:
    pid = server.process.pid
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def peak(p: int) -> int:
        status = Path(f"/proc/{p}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024

    return max(peak(c) for c in children)  # the engine core; beside it at most small helpers


def test_an_adapter_of_the_wrong_shapes_is_refused_before_its_tensors_are_read(lora_server, tmp_path):
    # A guard (sec16; it passed before any change): the adapter's tensors are taken with safe_open().get_tensor
    # before their shapes are checked, which would read a huge file whole on the engine's thread, but safetensors
    # (0.8) maps the file and get_tensor touches no page: nothing is read until the checked tensors are converted.
    # Should a safetensors version read eagerly, this fails. The file is sparse: 768 MiB announced, no disk.
    size = 768 * 2**20
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    header = json.dumps({key.format("A"): {"dtype": "F32", "shape": [8, size // 32], "data_offsets": [0, size]},
                         key.format("B"): {"dtype": "F32", "shape": [8, 8], "data_offsets": [size, size + 256]}})
    header += " " * (-len(header) % 8)
    with open(tmp_path / "adapter_model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + size + 256)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                              "target_modules": ["q_proj"]}))
    before = _core_peak_rss_bytes(lora_server)
    refused = httpx.post(f"{lora_server.url}/v1/load_lora_adapter", timeout=120,
                         json={"lora_name": "huge", "lora_path": str(tmp_path)})
    assert refused.status_code == 400 and "q_proj" in refused.json()["error"]["message"], refused.text
    assert _core_peak_rss_bytes(lora_server) - before < 200 * 2**20

"""/v1/embeddings through the real `openai` client against `flotilla serve --runner pooling`."""

from __future__ import annotations

import base64
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from flotilla.engine.server.embeddings import MAX_EMBEDDING_INPUTS

from .conftest import API_KEY, cpu_seconds, prefix_cache_hits_of, wait_until_idle

openai = pytest.importorskip("openai")

TEXTS = ["The harbour master counts the boats.", "lanterns", "Ein Schiff wird kommen"]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def pooling_client(pooling_server):
    return openai.OpenAI(base_url=f"{pooling_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf(tiny_model_dirs):
    from transformers import AutoModel, AutoTokenizer

    path = tiny_model_dirs["qwen3"]
    return AutoModel.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def hf_embedding(hf, ids: list[int]) -> np.ndarray:
    model, _ = hf
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json=body, headers=HEADERS, timeout=120)


def test_openai_client_embeddings_equal_hf(pooling_client, hf):
    # The client asks for base64 by default and decodes it: this checks the byte layout too.
    result = pooling_client.embeddings.create(model="tiny", input=TEXTS)
    tokenizer = hf[1]
    ids = [tokenizer.encode(t) for t in TEXTS]
    assert [d.index for d in result.data] == [0, 1, 2]
    for item, prompt in zip(result.data, ids, strict=True):
        np.testing.assert_allclose(item.embedding, hf_embedding(hf, prompt), atol=1e-4, rtol=1e-4)
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(len(p) for p in ids)
    assert result.model == "tiny"


def test_float_and_base64_agree_and_token_inputs_work(pooling_server, hf):
    ids = hf[1].encode(TEXTS[0])
    floats = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float"}).json()
    packed = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "base64"}).json()
    vector = floats["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(vector, dtype=np.float32))
    one = post(pooling_server, {"model": "tiny", "input": ids, "encoding_format": "float"}).json()
    many = post(pooling_server, {"model": "tiny", "input": [ids, ids[:3]], "encoding_format": "float"}).json()
    # Token ids give the same vector as the text; batched with another input the matmul shapes
    # change, so fp32 rounding may differ in the last bits.
    np.testing.assert_allclose(one["data"][0]["embedding"], vector, rtol=1e-5, atol=1e-6)
    assert len(many["data"]) == 2
    np.testing.assert_allclose(many["data"][0]["embedding"], vector, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(many["data"][1]["embedding"], hf_embedding(hf, ids[:3]), atol=1e-4, rtol=1e-4)
    assert many["usage"] == {"prompt_tokens": len(ids) + 3, "total_tokens": len(ids) + 3}


def test_a_long_list_is_embedded_call_by_call_and_other_requests_run_in_between(pooling_server, hf):
    # 200 inputs of 200 tokens: with the server's 256-token context, one engine call per input.
    rng = random.Random(0)
    vocab = hf[0].config.vocab_size
    prompts = [[rng.randrange(10, vocab) for _ in range(200)] for _ in range(200)]
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(post, pooling_server, {"model": "tiny", "input": prompts, "encoding_format": "float"})
        time.sleep(0.3)  # the long request reaches the engine first (if not, the check below is only weaker)
        short = post(pooling_server, {"model": "tiny", "input": "lanterns", "encoding_format": "float"})
        # Queued behind at most one of the long request's calls, not behind all 200 of them.
        assert short.status_code == 200 and not long.done(), "the short request waited for the whole list"
        answer = long.result()
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert [d["index"] for d in data] == list(range(200))
    assert answer.json()["usage"]["prompt_tokens"] == 200 * 200
    for i in (0, 101, 199):  # in the request's order, each as HF embeds it alone
        np.testing.assert_allclose(data[i]["embedding"], hf_embedding(hf, prompts[i]), atol=1e-4, rtol=1e-4)


def test_a_client_that_leaves_an_embeddings_request_stops_its_work(pooling_server):
    pid = pooling_server.process.pid
    # What one input of 200 tokens costs the server, in CPU seconds (~0.02 here): CPU time, which a loaded machine
    # does not change, where wall time would.
    sample = [[5 + i % 100] * 200 for i in range(40)]
    before = cpu_seconds(pid)
    assert post(pooling_server, {"model": "tiny", "input": sample}).status_code == 200
    per_input = (cpu_seconds(pid) - before) / len(sample)
    # 2,048 such inputs (the most a request may list): one engine call each, ~40 CPU s of work. The client gives up
    # after 1 s.
    prompts = [[5 + i % 100] * 200 for i in range(MAX_EMBEDDING_INPUTS)]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{pooling_server.url}/v1/embeddings", json={"model": "tiny", "input": prompts},
                   headers=HEADERS, timeout=httpx.Timeout(60, read=1.0))
    left = cpu_seconds(pid)
    assert wait_until_idle(pid), "the server was still computing a minute after the client left"
    # The disconnect cancels the list between two engine calls: the call in flight ends, no other starts (measured:
    # ~10 inputs' worth, whatever the machine's load). Going on would cost the rest of the 2,048.
    after = cpu_seconds(pid) - left
    assert after < 100 * per_input, f"the server computed {after:.1f} CPU s ({after / per_input:.0f} inputs' worth) " \
        "after the client left"
    assert post(pooling_server, {"model": "tiny", "input": "ok"}).status_code == 200


def test_a_request_lists_at_most_openais_2048_inputs(pooling_server, pooling_client):
    # There was no cap: an 8 MiB body of one-character texts is ~1.6M inputs, each tokenized on its own before any
    # was embedded (found by fuzzing the real server). OpenAI caps a list at 2,048 inputs; so does this server now.
    assert MAX_EMBEDDING_INPUTS == 2048
    full = pooling_client.embeddings.create(model="tiny", input=[[5 + i % 50] for i in range(2048)])
    assert [d.index for d in full.data] == list(range(2048))
    for given in (["x"] * 2049, [[5]] * 2049, ["x"] * 1_000_000):
        with pytest.raises(openai.BadRequestError) as info:
            pooling_client.embeddings.create(model="tiny", input=given)
        error = info.value.body
        assert error["param"] == "input" and "at most 2048" in error["message"], error
        assert f"lists {len(given)} inputs" in error["message"]
    # One prompt of token ids is one input, however long (here cut to the context by truncate_prompt_tokens).
    one = post(pooling_server, {"model": "tiny", "input": [5] * 3000, "truncate_prompt_tokens": 100})
    assert one.status_code == 200 and one.json()["usage"]["prompt_tokens"] == 100, one.text
    assert post(pooling_server, {"model": "tiny", "input": "ok"}).status_code == 200


def test_a_bad_input_late_in_a_list_is_refused_naming_its_index(pooling_server):
    prompts = [[5] * 200] * 40 + [[5] * 300]
    answer = post(pooling_server, {"model": "tiny", "input": prompts})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "input"
    assert answer.json()["error"]["message"].endswith(
        "However, input 40 has 300 tokens. Please reduce the length of the input.")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "dimensions": 8}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [1, 10**9]}, "input"),
    ({"input": [[1, 2], "mixed"]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": [[5] * 300]}, "input"),
    ({}, "input"),  # neither input nor messages
    ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),  # both
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True, "continue_final_message": True},
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}, "chat_template"),  # untrusted
    # vLLM's extras this server cannot honour: refused, not logged and ignored
    ({"messages": [{"role": "user", "content": "x"}], "mm_processor_kwargs": {"num_crops": 4}}, "mm_processor_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "media_io_kwargs": {"image": {"x": 1}}}, "media_io_kwargs"),
    ({"input": "x", "mm_processor_kwargs": {"num_crops": 4}}, "mm_processor_kwargs"),
    ({"input": "x", "padding": "max_length"}, "padding"),
    ({"input": "x", "priority": 1}, "priority"),  # the pooling pass is outside the scheduler's queue
    ({"input": "x", "priority": 2**40}, "priority"),
    ({"input": "x", "cache_salt": ""}, "cache_salt"),
    ({"input": "x", "cache_salt": "s" * 4097}, "cache_salt"),  # CACHE_SALT_MAX_CHARS: vLLM has no bound
    ({"input": "x", "request_id": ""}, "request_id"),
    ({"input": "x", "truncation_side": "middle"}, "truncation_side"),
    ({"input": "x", "normalize": True, "use_activation": False}, "use_activation"),
    ({"input": "x", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"}, "embed_dtype"),  # no fp8 encoder here
    ({"input": "x", "encoding_format": "base64", "endianness": "middle"}, "endianness"),
    # a conversation's rendering options with input: there is no conversation to render
    ({"input": "x", "add_generation_prompt": True}, "add_generation_prompt"),
    ({"input": "x", "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
])
def test_bad_requests_get_openai_error_json(pooling_server, body, param):
    answer = post(pooling_server, {"model": "tiny", **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "BadRequestError" or error["code"] == 400
    assert param in (error.get("param") or "") + error["message"]
    # The server keeps serving.
    assert post(pooling_server, {"model": "tiny", "input": "ok"}).status_code == 200


def test_generate_on_the_pooling_server_is_a_clear_400(pooling_client):
    with pytest.raises(openai.BadRequestError, match="pooling runner"):
        pooling_client.completions.create(model="tiny", prompt="hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="pooling runner"):
        pooling_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2, stream=True)


def test_embeddings_on_a_generate_server_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="--runner pooling"):
        client.embeddings.create(model="tiny", input="hello")


@pytest.mark.parametrize("given", [[[10**9]], "", ["ok"] * 5000 + [""]], ids=["outside the vocabulary", "empty",
                                                                          "5,000 texts then an empty one"])
def test_a_generate_server_refuses_embeddings_before_reading_the_input(server, given):
    # It tokenized and checked every input first and refused only at the engine: a bad input was named instead, and a
    # list of 100,000 short texts took 22 s of tokenizing before the refusal (found by fuzzing the real server).
    response = post(server, {"model": "tiny", "input": given})
    assert response.status_code == 400 and "--runner pooling" in response.json()["error"]["message"], response.text


def test_unknown_model_is_404(pooling_client):
    with pytest.raises(openai.NotFoundError):
        pooling_client.embeddings.create(model="nope", input="hello")


def test_truncate_prompt_tokens_embeds_the_last_tokens(pooling_server, hf):
    """vLLM's `truncate_prompt_tokens` on /v1/embeddings keeps the input's last N tokens (as on completions here).
    It was an unknown field, logged and ignored: the whole input was embedded (another vector), and an input
    longer than the context was refused instead of cut."""
    ids = hf[1].encode(TEXTS[0])
    for given in ([TEXTS[0], TEXTS[0]], [ids, ids]):
        body = {"model": "tiny", "input": given, "encoding_format": "float", "truncate_prompt_tokens": 3}
        answer = post(pooling_server, body)
        assert answer.status_code == 200, answer.text
        for item in answer.json()["data"]:
            np.testing.assert_allclose(item["embedding"], hf_embedding(hf, ids[-3:]), atol=1e-4, rtol=1e-4)
        assert answer.json()["usage"]["prompt_tokens"] == 6
    too_long = [ids[0]] * 300  # past the server's 256-token context: cut to it with -1
    answer = post(pooling_server, {"model": "tiny", "input": too_long, "truncate_prompt_tokens": -1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 256


def test_a_text_past_the_character_bound_is_truncated_not_refused(pooling_server):
    # As on completions and chat: a text longer than max_model_len x the longest token's characters is refused before
    # tokenizing, unless truncate_prompt_tokens will cut it (its tail may fit; vLLM bounds only untruncated text).
    huge = "harbour " * 6000
    refused = post(pooling_server, {"model": "tiny", "input": huge})
    assert refused.status_code == 400 and "characters" in refused.text, refused.text
    answer = post(pooling_server, {"model": "tiny", "input": huge, "truncate_prompt_tokens": 200})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 200


CONVERSATION = [{"role": "system", "content": "Rank ships."}, {"role": "user", "content": "The harbour at dawn"}]


def test_a_conversation_is_embedded_as_the_chat_template_renders_it_as_vllm(pooling_server, hf):
    # vLLM's EmbeddingChatRequest: `messages` in place of `input`, rendered by the model's template without a
    # generation prompt and without special tokens beyond the template's (its defaults), embedded as one prompt.
    tokenizer = hf[1]
    for extra, generation_prompt in (({}, False), ({"add_generation_prompt": True}, True)):
        answer = post(pooling_server, {"model": "tiny", "messages": CONVERSATION, "encoding_format": "float", **extra})
        assert answer.status_code == 200, answer.text
        text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=generation_prompt)
        ids = tokenizer.encode(text, add_special_tokens=False)
        (item,) = answer.json()["data"]
        np.testing.assert_allclose(item["embedding"], hf_embedding(hf, ids), atol=1e-4, rtol=1e-4)
        assert answer.json()["usage"]["prompt_tokens"] == len(ids)


def test_vllm_pooling_extras_are_honoured(pooling_server, hf):
    """vLLM's `truncation_side` "right" keeps the first truncate_prompt_tokens (on input and on a conversation), and
    `use_activation` (its newer name for `normalize`) false returns the raw pooled vector; both were logged and
    ignored (the last tokens embedded, the vector normalised)."""
    tokenizer = hf[1]
    ids = tokenizer.encode(TEXTS[0])
    answer = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float",
                                   "truncate_prompt_tokens": 3, "truncation_side": "right"})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], hf_embedding(hf, ids[:3]), atol=1e-4, rtol=1e-4)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    chat_ids = tokenizer.encode(text, add_special_tokens=False)
    answer = post(pooling_server, {"model": "tiny", "messages": CONVERSATION, "encoding_format": "float",
                                   "truncate_prompt_tokens": 5, "truncation_side": "right"})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], hf_embedding(hf, chat_ids[:5]),
                               atol=1e-4, rtol=1e-4)
    raw = {}
    for switch in ({"normalize": False}, {"use_activation": False}, {"normalize": False, "use_activation": False}):
        answer = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float", **switch})
        assert answer.status_code == 200, answer.text
        raw[tuple(switch)] = np.array(answer.json()["data"][0]["embedding"])
    assert abs(np.linalg.norm(raw[("use_activation",)]) - 1) > 1e-3
    np.testing.assert_allclose(raw[("use_activation",)], raw[("normalize",)], atol=1e-6)
    np.testing.assert_allclose(raw[("normalize", "use_activation")], raw[("normalize",)], atol=1e-6)
    answer = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float",
                                   "use_activation": True, "padding": "do_not_pad", "mm_processor_kwargs": {}})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], hf_embedding(hf, ids), atol=1e-4, rtol=1e-4)


def test_vllm_request_extras_name_the_response_and_keep_the_vector(pooling_server, hf):
    """vLLM's pooling extras `request_id` (the response's id, `embd-<id>`; the X-Request-Id header wins, as on
    completions), `cache_salt` and `priority` 0 are honoured; all three were logged and ignored (a random id)."""
    ids = hf[1].encode(TEXTS[0])
    answer = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float",
                                   "request_id": "batch-7", "cache_salt": "t" * 4096, "priority": 0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "embd-batch-7"
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], hf_embedding(hf, ids), atol=1e-4, rtol=1e-4)
    named = httpx.post(f"{pooling_server.url}/v1/embeddings", json={"model": "tiny", "input": "x", "request_id": "b"},
                       headers={**HEADERS, "X-Request-Id": "from-header"}, timeout=120)
    assert named.status_code == 200, named.text
    assert named.json()["id"] == "embd-from-header"
    unnamed = [post(pooling_server, {"model": "tiny", "input": "x"}).json()["id"] for _ in range(2)]
    assert unnamed[0] != unnamed[1] and all(i.startswith("embd-") for i in unnamed)


def test_cache_salt_keys_the_pooling_pass_blocks_as_on_generate(pooling_server, pooling_client, hf):
    """An embedding's prefix-cache blocks are hits for later embeddings of the same salt only: not for another salt
    nor for none, and unsalted blocks are no hits for a salted request; the vector stays HF's when they hit."""
    ids = list(range(300, 340))  # token ids: several full 8-token blocks, a prompt no other test sends

    def hits(salt: str | None) -> float:
        extra = {"cache_salt": salt} if salt is not None else None
        sent = []
        found = prefix_cache_hits_of(pooling_server, lambda: sent.append(
            pooling_client.embeddings.create(model="tiny", input=[ids], extra_body=extra)))
        np.testing.assert_allclose(sent[0].data[0].embedding, hf_embedding(hf, ids), atol=1e-4, rtol=1e-4)
        return found

    assert hits("tenant-a") == 0
    assert hits("tenant-a") > 0
    assert hits("tenant-b") == 0
    assert hits(None) == 0
    assert hits(None) > 0
    assert hits("tenant-c") == 0


def test_a_conversation_continued_is_embedded_open_ended(pooling_server, hf):
    # vLLM's continue_final_message on a chat embedding: the last (assistant) message left open, as HF renders it.
    conversation = [*CONVERSATION, {"role": "assistant", "content": "Three ships"}]
    answer = post(pooling_server, {"model": "tiny", "messages": conversation, "encoding_format": "float",
                                   "continue_final_message": True})
    assert answer.status_code == 200, answer.text
    text = hf[1].apply_chat_template(conversation, tokenize=False, continue_final_message=True)
    assert text.endswith("Three ships")
    ids = hf[1].encode(text, add_special_tokens=False)
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], hf_embedding(hf, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("endianness", ["native", "little", "big"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_base64_in_vllms_embed_dtype_and_endianness(pooling_server, dtype, endianness):
    # vLLM's extras: base64 of the vector cast to `embed_dtype` (as torch casts it), in `endianness` byte order. They
    # were logged and ignored: a client asking float16 decoded float32 bytes as twice as many garbage halves.
    floats = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "float"})
    vector = torch.tensor(floats.json()["data"][0]["embedding"], dtype=torch.float32)
    answer = post(pooling_server, {"model": "tiny", "input": TEXTS[0], "encoding_format": "base64",
                                   "embed_dtype": dtype, "endianness": endianness})
    assert answer.status_code == 200, answer.text
    data = base64.b64decode(answer.json()["data"][0]["embedding"])
    expected = vector.to(getattr(torch, dtype)).view(torch.int16 if dtype != "float32" else torch.int32).numpy()
    order = {"native": "=", "little": "<", "big": ">"}[endianness]
    assert data == expected.astype(expected.dtype.newbyteorder(order)).tobytes()

"""The Responses API's store (engine/server/responses.py) keeps each response as its JSON body."""

from __future__ import annotations

import gc
import json
import re
import sys

import httpx
import openai
import pytest

from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import OFF_LOOP_VALUES
from flotilla.engine.server.responses import ResponseStore, stored

from .conftest import API_KEY, start_server, stop_server

ENTRIES = 50_000


def _response_with_logprobs(response_id: str) -> dict:
    entry = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
    part = {"type": "output_text", "text": "a" * ENTRIES, "annotations": [],
            "logprobs": [dict(entry, top_logprobs=[dict(entry)]) for _ in range(ENTRIES)]}
    return {"id": response_id, "object": "response", "status": "completed",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "content": [part]}]}


def test_a_stored_response_leaves_nothing_for_the_garbage_collector_to_walk():
    # Kept as dicts, a response with output logprobs was millions of objects alive in the store, which every full
    # collection (on the event loop) walked: /health waited 12 s behind one of 1.57M entries (bench/reply_stall.py).
    store = ResponseStore()
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a" * ENTRIES}]
    gc.collect()
    before = len(gc.get_objects())
    response = _response_with_logprobs("resp_1")
    store.put(stored(response, conversation))
    expected = json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode()
    del response
    gc.collect()
    assert len(gc.get_objects()) - before < 100  # not the 100k entries' dicts and lists
    entry = store.get("resp_1")
    assert entry.body == expected  # the body GET sends: JSONResponse's bytes of the response
    assert entry.conversation == conversation
    assert store.num_bytes == entry.size == len(expected) + len(json.dumps(conversation))


def test_the_byte_bound_drops_the_oldest_by_their_stored_size():
    first = stored(_response_with_logprobs("resp_1"), [])
    store = ResponseStore(max_bytes=first.size + 10)
    store.put(first)
    store.put(stored({"id": "resp_2", "output": []}, []))
    with pytest.raises(APIError) as dropped:
        store.get("resp_1")
    assert dropped.value.status == 404
    assert store.get("resp_2").body == b'{"id":"resp_2","output":[]}' and store.num_bytes == store.get("resp_2").size


# The real server, reporting from inside its process the bytes of every reply body encoded: each call of the encoder
# that json_reply.py encodes bodies with (whole, or in pieces) and of Starlette's JSONResponse (a small reply's, as
# FastAPI sends it). A test-only hook around the real `flotilla serve` entry point, not part of the product.
COUNTING_SERVER = '''
import json
import sys
from starlette.responses import JSONResponse
from flotilla.engine.server import json_reply

class CountingEncoder(json.JSONEncoder):
    def encode(self, o):
        text = super().encode(o)
        print(f"encoded {len(text.encode())} bytes", flush=True)
        return text

json_reply.REPLY_ENCODER = CountingEncoder(**{k: getattr(json_reply.REPLY_ENCODER, k) for k in (
    "ensure_ascii", "allow_nan", "indent")}, separators=(",", ":"))
render = JSONResponse.render

def counting_render(self, content):
    body = render(self, content)
    print(f"encoded {len(body)} bytes", flush=True)
    return body

JSONResponse.render = counting_render
if __name__ == "__main__":
    from flotilla.engine.server.cli import main
    sys.exit(main(sys.argv[1:]))
'''


STORE_BYTES = 2_500_000


@pytest.fixture(scope="module")
def counting_server(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("counting-server")
    script = root / "counting_server.py"
    script.write_text(COUNTING_SERVER)
    # A store of 2.5 MB (FLOTILLA_RESPONSES_STORE_BYTES) for the byte bound's test, last in this module: the
    # other tests' responses are small, and each reads back only its newest.
    s = start_server(tiny_model_dirs["llama"], root / "server.log", "--served-model-name", "tiny", "--max-model-len",
                     "512", "--disable-log-stats", env={"VLLM_API_KEY": API_KEY,
                                                        "FLOTILLA_RESPONSES_STORE_BYTES": str(STORE_BYTES)},
                     launcher=(sys.executable, str(script)))
    yield s
    stop_server(s)


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("tokens", [8, 300])  # a small reply, encoded on the loop; a large one, on a worker thread
def test_a_non_streamed_responses_reply_is_encoded_once(counting_server, store, tokens):
    # The reply was encoded twice when stored: once for the store (its body, which GET sends) and once again to
    # send it. The same bytes serve both now.
    client = openai.OpenAI(base_url=f"{counting_server.url}/v1", api_key=API_KEY)
    since = len(counting_server.log.read_text())
    raw = client.responses.with_raw_response.create(
        model="tiny", input="hi", max_output_tokens=tokens, store=store, top_logprobs=20,
        include=["message.output_text.logprobs"], extra_body={"ignore_eos": True})
    body = raw.http_response.content
    encoded = sum(int(n) for n in re.findall(r"encoded (\d+) bytes", counting_server.log.read_text()[since:]))
    response = raw.parse()
    assert len(response.output[0].content[0].logprobs) == tokens
    assert (tokens * 21 > OFF_LOOP_VALUES) == (tokens == 300)  # the two paths (the entries alone decide it)
    # once: the whole body (a large one also encodes each of its large dicts' keys apart, a few bytes each)
    assert len(body) <= encoded < len(body) + 1000, (encoded, len(body))
    if store:
        assert client.responses.with_raw_response.retrieve(response.id).http_response.content == body


def test_a_deleted_response_leaves_the_store_and_its_bytes():
    store = ResponseStore()
    store.put(stored({"id": "resp_1", "output": []}, [{"role": "user", "content": "hi"}]))
    store.put(stored({"id": "resp_2", "output": []}, []))
    store.delete("resp_1")
    assert store.num_bytes == store.get("resp_2").size
    for call in (store.get, store.delete):
        with pytest.raises(APIError) as gone:
            call("resp_1")
        assert gone.value.status == 404


def test_delete_forgets_a_stored_response_for_the_openai_client(counting_server):
    # DELETE /v1/responses/{id} was a 405. Now the SDK's responses.delete works (it reads no body: None), and the
    # response is gone: GET, previous_response_id and a second DELETE are 404s in OpenAI's error JSON.
    client = openai.OpenAI(base_url=f"{counting_server.url}/v1", api_key=API_KEY, max_retries=0)
    first = client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    kept = client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    raw = client.responses.with_raw_response.delete(first.id)
    assert raw.http_response.status_code == 200 and raw.parse() is None
    assert raw.http_response.json() == {"id": first.id, "object": "response", "deleted": True}  # OpenAI's answer
    for gone in (lambda: client.responses.retrieve(first.id), lambda: client.responses.delete(first.id),
                 lambda: client.responses.create(model="tiny", input="and?", max_output_tokens=2,
                                                 previous_response_id=first.id)):
        with pytest.raises(openai.NotFoundError) as err:
            gone()
        assert err.value.body["code"] == "response_not_found" and first.id in err.value.body["message"]
    assert client.responses.retrieve(kept.id).id == kept.id  # the others stay
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_never_was")
    # the API key guards it as every /v1 route: without it, a 401 and the response stays
    keyless = openai.OpenAI(base_url=f"{counting_server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        keyless.responses.delete(kept.id)
    assert client.responses.retrieve(kept.id).id == kept.id


def test_the_store_is_bounded_in_bytes_and_drops_the_oldest_first(counting_server):
    """The store was bounded by count only (1,024): each entry keeps its whole conversation, `instructions` and
    `metadata` (no size bound), so 1,024 bodies of 8 MiB could hold 8 GiB in the API process. Now also by bytes
    (256 MiB; FLOTILLA_RESPONSES_STORE_BYTES, here 2.5 MB): the oldest go first, the newest always stays. (Last in
    this module: it leaves the store holding one response of 3 MB.)"""
    server, headers = counting_server, {"Authorization": f"Bearer {API_KEY}"}

    def create(blob_bytes: int, **extra) -> str:
        body = {"model": "tiny", "input": "Name a colour of the sea.", "max_output_tokens": 1,
                "metadata": {"blob": "x" * blob_bytes}, **extra}
        response = httpx.post(f"{server.url}/v1/responses", json=body, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["id"]

    def stored(response_id: str) -> bool:
        got = httpx.get(f"{server.url}/v1/responses/{response_id}", headers=headers, timeout=30)
        assert got.status_code in (200, 404), got.text
        return got.status_code == 200

    ids = [create(1_000_000) for _ in range(3)]  # with whatever the module's earlier tests stored before them
    assert [stored(i) for i in ids] == [False, True, True]
    # A chain goes on from the newest; a response larger than the whole bound is kept, alone.
    follow = create(10, previous_response_id=ids[-1])
    huge = create(3_000_000, previous_response_id=follow)
    assert [stored(i) for i in (*ids, follow, huge)] == [False, False, False, False, True]

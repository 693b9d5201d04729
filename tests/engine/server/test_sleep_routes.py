"""vLLM's sleep-mode routes on a real server (`--enable-sleep-mode`, VLLM_SERVER_DEV_MODE=1): POST /sleep, POST
/wake_up, GET /is_sleeping over httpx, the completions through the openai client. Asleep, /health stays 200 and a
new request waits (vllm:num_requests_waiting) until /wake_up, then answers what it answered before; a request in
flight at /sleep finishes with finish_reason "abort" (a stream's last chunk; a reply with what it generated); bad
arguments are 400s; without dev mode the routes are 404s (the shared server)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.engine.server.conftest import API_KEY, Server, start_tiny_server, stop_server, wait_until_engine_idle

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The harbour master counts the ships"


@pytest.fixture(scope="module", params=["1", "0"], ids=["core-process", "in-thread"])
def sleepy(request, tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    """The tiny server in dev mode with --enable-sleep-mode: its engine core in a process of its own, then on a
    thread of the server (VLLM_ENABLE_V1_MULTIPROCESSING=0), whose loop delivers the aborted requests alike."""
    if request.param == "1":  # the session's (conftest.py), shared with test_sleep_modes_server.py
        yield request.getfixturevalue("sleep_mode_server")
        return
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": request.param}
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("sleepy") / "server.log",
                          "--enable-sleep-mode", env=env)
    yield s
    stop_server(s)


def _post(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", params=params, headers=AUTH, timeout=120)


def _is_sleeping(server: Server) -> bool:
    reply = httpx.get(f"{server.url}/is_sleeping", headers=AUTH, timeout=30)
    assert reply.status_code == 200
    return reply.json()["is_sleeping"]


def _complete(server: Server) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    return reply.choices[0].text


def _wait_for(condition, what: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_sleep_and_wake_up_keep_the_answers(sleepy):
    before = _complete(sleepy)
    assert not _is_sleeping(sleepy)
    assert _post(sleepy, "/sleep", level=1).status_code == 200
    assert _is_sleeping(sleepy)
    assert httpx.get(f"{sleepy.url}/health", timeout=10).status_code == 200
    answer: list[str] = []
    waiter = threading.Thread(target=lambda: answer.append(_complete(sleepy)))
    waiter.start()
    _wait_for(lambda: sleepy.metric("vllm:num_requests_waiting") == 1, "the request never queued")
    assert not answer  # it waits for the wake-up: nothing runs while asleep
    assert _post(sleepy, "/wake_up", tags="weights").status_code == 200
    assert _is_sleeping(sleepy)  # the KV cache still sleeps
    assert _post(sleepy, "/wake_up", tags="kv_cache").status_code == 200
    assert not _is_sleeping(sleepy)
    waiter.join(300)
    assert answer == [before]


def test_level_2_then_reload_weights_over_collective_rpc(sleepy):
    before = _complete(sleepy)
    assert _post(sleepy, "/sleep", level=2).status_code == 200
    assert _post(sleepy, "/wake_up", tags="weights").status_code == 200
    reply = httpx.post(f"{sleepy.url}/collective_rpc", json={"method": "reload_weights"}, headers=AUTH, timeout=120)
    assert reply.status_code == 200 and reply.json() == {"results": [None]}
    assert _post(sleepy, "/wake_up", tags="kv_cache").status_code == 200
    assert _complete(sleepy) == before


@pytest.mark.parametrize(("body", "message"), [
    ({"method": "init_device"}, "only the method 'reload_weights'"),
    ([], "only the method 'reload_weights'"),
])
def test_collective_rpc_runs_reload_weights_only(sleepy, body, message):
    reply = httpx.post(f"{sleepy.url}/collective_rpc", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 400 and message in reply.json()["error"]["message"]


def test_reload_while_the_weights_sleep_is_400(sleepy):
    assert _post(sleepy, "/sleep", level=2).status_code == 200
    reply = httpx.post(f"{sleepy.url}/collective_rpc", json={"method": "reload_weights"}, headers=AUTH, timeout=30)
    assert reply.status_code == 400 and "wake_up(tags=['weights'])" in reply.json()["error"]["message"]
    assert _post(sleepy, "/wake_up").status_code == 200
    assert httpx.post(f"{sleepy.url}/collective_rpc", json={"method": "reload_weights"}, headers=AUTH,
                      timeout=120).status_code == 200


def test_a_stream_in_flight_ends_with_a_final_abort_chunk(sleepy):
    # vLLM's abort-mode sleep finishes the requests in flight: a last chunk with finish_reason "abort", then [DONE]
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 240, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", f"{sleepy.url}/v1/completions", json=body, headers=AUTH, timeout=120) as reply:
        assert reply.status_code == 200
        lines = []
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
            if len(events) == 1 and len(lines) == 1:
                assert _post(sleepy, "/sleep", level=1).status_code == 200
    assert lines[-1] == "data: [DONE]"
    assert all("error" not in e for e in events), events[-1]
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "abort"
    assert len(events) < 240  # ended by the sleep, not by its length (here: 4 events of 240 at load 8)
    assert _post(sleepy, "/wake_up").status_code == 200
    wait_until_engine_idle(sleepy)
    assert sleepy.metric("vllm:kv_cache_usage_perc") == 0


def test_a_reply_in_flight_holds_what_it_generated_with_finish_reason_abort(sleepy):
    from openai import OpenAI

    client = OpenAI(base_url=f"{sleepy.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    replies: list = []
    wait_until_engine_idle(sleepy)  # no earlier request's count still to come
    counted = _finished(sleepy)
    before = sleepy.metric("vllm:generation_tokens_total")
    waiter = threading.Thread(target=lambda: replies.append(client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=240, temperature=0, extra_body={"ignore_eos": True})))
    waiter.start()
    deadline = time.monotonic() + 60
    while sleepy.metric("vllm:generation_tokens_total") == before:  # running: its first tokens are out
        assert time.monotonic() < deadline, "it never generated"
    assert _post(sleepy, "/sleep", level=1).status_code == 200
    waiter.join(120)
    [reply] = replies
    assert reply.choices[0].finish_reason == "abort"
    assert 0 < reply.usage.completion_tokens < 240 and reply.choices[0].text, reply
    # vLLM counts the abort outputs of its pause as finished requests: finished_reason "abort", and the per-request
    # histograms (a client's disconnect is counted nowhere: test_dropin_requests). Published before /sleep answers.
    after = _finished(sleepy)
    assert after["abort"] == counted["abort"] + 1 and after["stop"] + after["length"] == counted["stop"] + \
        counted["length"], (counted, after)
    assert after["generated"] - counted["generated"] == reply.usage.completion_tokens
    assert after["e2e"] == counted["e2e"] + 1
    assert _post(sleepy, "/wake_up").status_code == 200
    wait_until_engine_idle(sleepy)
    assert sleepy.metric("vllm:kv_cache_usage_perc") == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "reply"])
def test_a_response_in_flight_is_cancelled_with_what_it_generated(sleepy, stream):
    # vLLM's Responses API: a generation that finished "abort" is status "cancelled" (no incomplete_details); its
    # cut-short message item is "incomplete". A stream still ends with response.completed (OpenAI has no cancelled
    # event; vLLM's), its response cancelled; GET of the stored response says so too.
    body = {"model": "tiny", "input": PROMPT, "max_output_tokens": 200, "min_tokens": 200, "stream": stream}
    url = f"{sleepy.url}/v1/responses"
    if stream:
        events = []
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=120) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    if events[-1]["type"] == "response.output_text.delta" and len(events) == 5:
                        assert _post(sleepy, "/sleep", level=1).status_code == 200
        assert events[-1]["type"] == "response.completed", [e["type"] for e in events]
        assert not [e for e in events if e["type"] in ("error", "response.failed", "response.incomplete")]
        [done] = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert done["status"] == "incomplete"
        response = events[-1]["response"]
    else:
        replies: list = []
        before = sleepy.metric("vllm:generation_tokens_total")
        waiter = threading.Thread(target=lambda: replies.append(httpx.post(url, json=body, headers=AUTH,
                                                                           timeout=120)))
        waiter.start()
        _wait_for(lambda: sleepy.metric("vllm:generation_tokens_total") > before, "it never generated", 60)
        assert _post(sleepy, "/sleep", level=1).status_code == 200
        waiter.join(120)
        assert replies[0].status_code == 200, replies[0].text
        response = replies[0].json()
    assert (response["status"], response["incomplete_details"]) == ("cancelled", None)
    [message] = response["output"]
    assert message["status"] == "incomplete" and message["content"][0]["text"]
    assert 0 < response["usage"]["output_tokens"] < 200
    assert _post(sleepy, "/wake_up").status_code == 200
    stored = httpx.get(f"{url}/{response['id']}", headers=AUTH, timeout=30)
    assert stored.status_code == 200 and stored.json()["status"] == "cancelled"
    wait_until_engine_idle(sleepy)


def _finished(server: Server) -> dict[str, float]:
    """vllm:request_success_total by finished_reason, and the per-request histograms' request and token counts."""
    metrics = server.metrics()
    counts = {reason: metrics[f'vllm:request_success_total{{finished_reason="{reason}",model_name="tiny"}}']
              for reason in ("stop", "length", "abort")}
    return counts | {"e2e": server.metric("vllm:e2e_request_latency_seconds_count"),
                     "generated": server.metric("vllm:request_generation_tokens_sum")}


@pytest.mark.parametrize(("path", "params", "message"), [
    ("/sleep", {"level": 3}, "sleep level must be 0, 1 or 2"),
    ("/sleep", {"level": "deep"}, "sleep level must be 0, 1 or 2"),
    ("/sleep", {"level": 1, "mode": "pause"}, "sleep mode must be 'abort', 'wait' or 'keep'"),
    ("/wake_up", {"tags": "weight"}, "unknown wake_up tag"),
])
def test_bad_arguments_are_400(sleepy, path, params, message):
    reply = _post(sleepy, path, **params)
    assert reply.status_code == 400
    assert message in reply.json()["error"]["message"]
    assert not _is_sleeping(sleepy)


def test_the_start_up_log_says_sleep_mode_and_dev_mode(sleepy):
    log = sleepy.log.read_text()
    assert "sleep mode enabled (--enable-sleep-mode)" in log
    assert "development routes /sleep, /wake_up and /is_sleeping are enabled" in log


def test_the_routes_need_the_api_key(sleepy):
    assert httpx.post(f"{sleepy.url}/sleep", timeout=30).status_code == 401
    assert not _is_sleeping(sleepy)


def test_without_dev_mode_the_routes_are_404(server):
    assert httpx.post(f"{server.url}/sleep", headers=AUTH, timeout=30).status_code == 404
    assert httpx.post(f"{server.url}/wake_up", headers=AUTH, timeout=30).status_code == 404
    assert httpx.get(f"{server.url}/is_sleeping", headers=AUTH, timeout=30).status_code == 404
    assert httpx.post(f"{server.url}/collective_rpc", headers=AUTH, timeout=30).status_code == 404

"""Sleep mode's pause modes and its metric on one real server (`--enable-sleep-mode`, VLLM_SERVER_DEV_MODE=1):
`/sleep?mode=wait` lets a stream in flight finish and answers once the engine sleeps; `mode=keep` holds a stream
across the sleep, and after `/wake_up` it ends with the text it would have had; vllm:engine_sleep_state follows
the sleep level as vLLM's does. The routes' basics: test_sleep_routes.py."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.engine.server.conftest import API_KEY, Server, wait_until_engine_idle

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The harbour master counts the ships"
# Long enough to be still running when the /sleep sent at its first event arrives (at 40 tokens, once in three runs
# at load 12 it had ended: the keep test saw no request waiting).
STREAM = {"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0,
          "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def sleepy(sleep_mode_server: Server) -> Server:
    """The shared sleep-mode server (conftest.py), awake and idle."""
    wait_until_engine_idle(sleep_mode_server)
    return sleep_mode_server


def _post(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", params=params, headers=AUTH, timeout=120)


def _sleep_state(server: Server) -> dict[str, float]:
    prefix = 'vllm:engine_sleep_state{model_name="tiny",sleep_state="'
    return {k[len(prefix):-2]: v for k, v in server.metrics().items() if k.startswith(prefix)}


def _stream(server: Server, on_first_event) -> list[dict]:
    """The stream's events (its usage chunk included); `on_first_event()` runs once the first has come."""
    events: list[dict] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=STREAM, headers=AUTH, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 1:
                    on_first_event()
    return events


def _text(events: list[dict]) -> str:
    assert all("error" not in e for e in events), events[-1]
    return "".join(c["text"] for e in events for c in e["choices"])


def _reference(server: Server) -> str:
    body = {k: v for k, v in STREAM.items() if k not in ("stream", "stream_options")}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=120)
    return reply.json()["choices"][0]["text"]


def test_the_sleep_state_metric_follows_the_level(sleepy):
    assert _sleep_state(sleepy) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
    assert _post(sleepy, "/sleep", level=1).status_code == 200
    assert _sleep_state(sleepy) == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
    assert _post(sleepy, "/wake_up").status_code == 200
    assert _sleep_state(sleepy) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
    assert _post(sleepy, "/sleep", level=2).status_code == 200
    assert _sleep_state(sleepy) == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}
    assert _post(sleepy, "/wake_up", tags="weights").status_code == 200
    assert _sleep_state(sleepy)["discard_all"] == 1  # the KV cache still sleeps: /is_sleeping says so too
    assert _post(sleepy, "/wake_up", tags="kv_cache").status_code == 200
    assert httpx.post(f"{sleepy.url}/collective_rpc", json={"method": "reload_weights"}, headers=AUTH,
                      timeout=120).status_code == 200
    assert _post(sleepy, "/sleep", level=0).status_code == 200
    assert _sleep_state(sleepy) == {"awake": 0, "weights_offloaded": 0, "discard_all": 0}  # a pause: no memory
    assert _post(sleepy, "/wake_up", tags="scheduling").status_code == 200
    assert _sleep_state(sleepy)["awake"] == 1


def test_wait_lets_a_stream_in_flight_finish(sleepy):
    expected = _reference(sleepy)
    answers: list[httpx.Response] = []
    sleeper = threading.Thread(target=lambda: answers.append(_post(sleepy, "/sleep", level=1, mode="wait")))
    events = _stream(sleepy, sleeper.start)
    sleeper.join(120)
    assert [a.status_code for a in answers] == [200]
    assert _text(events) == expected and events[-1]["usage"]["completion_tokens"] == STREAM["max_tokens"]
    assert httpx.get(f"{sleepy.url}/is_sleeping", headers=AUTH, timeout=30).json() == {"is_sleeping": True}
    assert _sleep_state(sleepy)["weights_offloaded"] == 1
    assert _post(sleepy, "/wake_up").status_code == 200


def test_keep_holds_a_stream_across_the_sleep(sleepy):
    expected = _reference(sleepy)

    def sleep_then_wake() -> None:
        assert _post(sleepy, "/sleep", level=1, mode="keep").status_code == 200
        assert sleepy.metric("vllm:num_requests_waiting") == 1  # preempted: it waits, its KV freed with the pool
        assert sleepy.metric("vllm:kv_cache_usage_perc") == 0
        assert _post(sleepy, "/wake_up").status_code == 200

    events = _stream(sleepy, sleep_then_wake)
    assert _text(events) == expected and events[-1]["usage"]["completion_tokens"] == STREAM["max_tokens"]
    wait_until_engine_idle(sleepy)
    assert sleepy.metric("vllm:kv_cache_usage_perc") == 0


def test_an_unknown_mode_is_400(sleepy):
    reply = _post(sleepy, "/sleep", level=1, mode="pause")
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "mode" and "sleep mode must be 'abort', 'wait' or 'keep'" in error["message"]
    assert httpx.get(f"{sleepy.url}/is_sleeping", headers=AUTH, timeout=30).json() == {"is_sleeping": False}

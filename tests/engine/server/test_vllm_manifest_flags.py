"""`vllm serve` flags that existing commands and manifests carry, given to the real server: --model beside MODEL,
--max-logprobs (vLLM's 400 above it), --enable-log-requests (a line per request) with --max-log-len (its prompts
cut), --trust-remote-code, --response-role, --return-tokens-as-token-ids, --disable-uvicorn-access-log,
--disable-access-log-for-endpoints and --tokenizer-mode hf."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, start_server, stop_server, wait_until_engine_idle

CAP = 3  # --max-logprobs
LOG_LEN = 12  # --max-log-len
ROLE = "navigator"  # --response-role


@pytest.fixture(scope="module")
def manifest_server(tiny_model_dirs, tmp_path_factory):
    s = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("manifest") / "server.log",
                     "--model", str(tiny_model_dirs["llama"]), "--max-logprobs", str(CAP), "--enable-log-requests",
                     "--trust-remote-code", "--served-model-name", "tiny", "--disable-log-stats",
                     "--max-log-len", str(LOG_LEN), "--response-role", ROLE, "--return-tokens-as-token-ids",
                     "--disable-uvicorn-access-log", "--disable-access-log-for-endpoints", "/health,/metrics",
                     "--tokenizer-mode", "hf",
                     # vLLM's uvicorn level (start_server quiets it): the access lines would show here.
                     "--uvicorn-log-level", "info",
                     env={"VLLM_API_KEY": API_KEY, "VLLM_LOGGING_LEVEL": "debug"})
    yield s
    stop_server(s)


@pytest.fixture
def capped(manifest_server):
    return openai.OpenAI(base_url=f"{manifest_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _log_with(server, text: str, deadline_s: float = 30) -> str:
    """The server's log once it holds `text` (log lines are flushed as they are written, but not instantly)."""
    end = time.monotonic() + deadline_s
    while text not in (log := server.log.read_text()) and time.monotonic() < end:
        time.sleep(0.2)
    return log


def test_logprobs_up_to_max_logprobs_are_served(capped):
    chat = capped.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                          logprobs=True, top_logprobs=CAP)
    assert all(len(t.top_logprobs) == CAP for t in chat.choices[0].logprobs.content)
    completion = capped.completions.create(model="tiny", prompt="Hello", max_tokens=2, logprobs=CAP)
    assert all(len(top) >= CAP for top in completion.choices[0].logprobs.top_logprobs)


@pytest.mark.parametrize(("call", "param", "kind"), [
    (lambda c: c.completions.create(model="tiny", prompt="Hello", max_tokens=2, logprobs=CAP + 1), "logprobs",
     "sample"),
    (lambda c: c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                         logprobs=True, top_logprobs=CAP + 1), "top_logprobs", "sample"),
    (lambda c: c.completions.create(model="tiny", prompt="Hello", max_tokens=2,
                                    extra_body={"prompt_logprobs": CAP + 1}), "prompt_logprobs", "prompt"),
    (lambda c: c.responses.create(model="tiny", input="Hi", max_output_tokens=2, top_logprobs=CAP + 1,
                                  include=["message.output_text.logprobs"]), "top_logprobs", "sample"),
])
def test_more_logprobs_than_max_logprobs_are_vllms_400(capped, manifest_server, call, param, kind):
    with pytest.raises(openai.BadRequestError) as err:
        call(capped)
    error = err.value.body
    assert error["param"] == param, error
    assert error["message"] == f"Requested {kind} logprobs of {CAP + 1}, which is greater than max allowed: {CAP}"
    assert manifest_server.metric("vllm:kv_cache_usage_perc") == 0


def test_enable_log_requests_logs_each_request_and_its_end(capped, manifest_server):
    prompt = "The lighthouse keeper counted the ships that passed the rocks every night of the year"
    completion = capped.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                                           extra_body={"request_id": "manifest-log-check"})
    assert completion.id.endswith("manifest-log-check") and completion.usage.prompt_tokens > LOG_LEN
    log = _log_with(manifest_server, "Finished request cmpl-manifest-log-check")
    lines = [line for line in log.splitlines() if "cmpl-manifest-log-check" in line]
    received = [line for line in lines if "Received request" in line]
    assert len(received) == 1 and received[0].startswith("INFO ") and "max_tokens=3" in received[0]
    # As vLLM: the prompt only at DEBUG (this server runs with VLLM_LOGGING_LEVEL=debug), never in the INFO lines,
    # and cut to --max-log-len characters and token ids.
    prompts = [line for line in lines if "prompt_token_ids: [" in line]
    assert len(prompts) == 1 and prompts[0].startswith("DEBUG "), lines
    assert f"prompt: {prompt[:LOG_LEN]!r}," in prompts[0] and "keeper" not in prompts[0]
    logged_ids = re.search(r"prompt_token_ids: \[([^\]]*)\]", prompts[0]).group(1).split(",")
    assert len(logged_ids) == LOG_LEN
    assert any(line.startswith("INFO ") and "Finished request" in line for line in lines)
    assert "POST /v1/completions" not in log  # --disable-uvicorn-access-log: no access log line


def test_no_access_line_is_logged_for_the_endpoints_named(manifest_server, capped):
    # vLLM's manifests give both flags (OpenShift AI's default): --disable-uvicorn-access-log wins, no path leaves an
    # access line (the paths alone: test_access_log.py), and the request log still works.
    for path in ("/health", "/metrics", "/health?probe=1"):
        assert httpx.get(f"{manifest_server.url}{path}", timeout=30).status_code == 200
    capped.completions.create(model="tiny", prompt="Hi", max_tokens=1, extra_body={"request_id": "access-log-check"})
    log = _log_with(manifest_server, "Finished request cmpl-access-log-check")
    assert "Finished request cmpl-access-log-check" in log
    assert "GET /health" not in log and "GET /metrics" not in log and "POST /v1/completions" not in log


def test_a_request_id_with_control_bytes_never_reaches_the_log(manifest_server):
    """Log injection: a client's X-Request-Id (or body `request_id`) names the request in its log lines; one holding
    an ESC sequence or a forged line is refused with a 400 before anything is logged, and the log (INFO and DEBUG
    lines) holds none of its bytes. Raw HTTP: the SDKs refuse to send such a header."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1}
    for sent in ({"headers": {**headers, "X-Request-Id": b"x\x1b[2Jforged"}, "json": body},
                 {"headers": headers, "json": {**body, "request_id": "x\nINFO Finished request forged"}}):
        response = httpx.post(f"{manifest_server.url}/v1/completions", timeout=120, **sent)
        assert response.status_code == 400, response.text
    given = httpx.post(f"{manifest_server.url}/v1/completions", timeout=120,
                       headers={**headers, "X-Request-Id": "after-control-bytes"}, json=body)
    assert given.status_code == 200, given.text
    log = _log_with(manifest_server, "Finished request cmpl-after-control-bytes")
    assert "Finished request cmpl-after-control-bytes" in log
    assert "\x1b" not in log and "forged" not in log


def test_response_role_names_the_reply_after_a_generation_prompt(capped, manifest_server):
    messages = [{"role": "user", "content": "Hi"}]
    chat = capped.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert chat.choices[0].message.role == ROLE
    stream = capped.chat.completions.create(model="tiny", messages=messages, max_tokens=2, stream=True)
    assert next(iter(stream)).choices[0].delta.role == ROLE
    stream.close()
    # Without a generation prompt the reply continues the last message, in its role (vLLM's rule).
    started = [*messages, {"role": "assistant", "content": "He"}]
    continued = capped.chat.completions.create(model="tiny", messages=started, max_tokens=2,
                                               extra_body={"add_generation_prompt": False})
    assert continued.choices[0].message.role == "assistant"


def test_return_tokens_as_token_ids_is_the_default_of_requests(capped, manifest_server):
    default = capped.completions.create(model="tiny", prompt="Hello", max_tokens=2, logprobs=1)
    assert all(re.fullmatch(r"token_id:\d+", t) for t in default.choices[0].logprobs.tokens)
    chat = capped.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                          logprobs=True, top_logprobs=1)
    assert all(t.token.startswith("token_id:") for t in chat.choices[0].logprobs.content)
    null = httpx.post(f"{manifest_server.url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "tiny", "prompt": "Hello", "max_tokens": 2, "logprobs": 1,
                            "return_tokens_as_token_ids": None}, timeout=120).json()
    assert all(t.startswith("token_id:") for t in null["choices"][0]["logprobs"]["tokens"])  # null: the flag's
    text = capped.completions.create(model="tiny", prompt="Hello", max_tokens=2, logprobs=1,
                                     extra_body={"return_tokens_as_token_ids": False})
    assert not any(t.startswith("token_id:") for t in text.choices[0].logprobs.tokens)


def test_a_request_whose_client_goes_away_is_logged_as_aborted(capped, manifest_server):
    stream = capped.completions.create(model="tiny", prompt="Tell a long story", max_tokens=400, stream=True,
                                       extra_body={"request_id": "manifest-abort-check", "ignore_eos": True})
    next(iter(stream))
    stream.close()
    log = _log_with(manifest_server, "Aborted request cmpl-manifest-abort-check")
    assert "Aborted request cmpl-manifest-abort-check" in log
    assert "Finished request cmpl-manifest-abort-check" not in log
    wait_until_engine_idle(manifest_server)  # the abort frees its blocks after the log line: later tests read them


def test_requests_are_not_logged_by_default(client, server):
    client.completions.create(model="tiny", prompt="The lighthouse keeper counted", max_tokens=2)
    client.completions.create(model="tiny", prompt="Once more", max_tokens=2)  # the first one's end is logged by now
    assert "Received request" not in server.log.read_text()
    assert "Finished request" not in server.log.read_text()


def _vocab_size(model_dir) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


def test_minus_one_logprobs_are_the_vocabulary_bounded_by_max_logprobs(capped, manifest_server, tiny_model_dirs):
    """vLLM's -1 for chat's top_logprobs and for prompt_logprobs means every vocabulary entry: a count of the
    vocabulary size, which --max-logprobs 3 refuses in vLLM's words; completions' logprobs takes no -1 (as vLLM).
    With --max-logprobs -1 they are served: test_whole_vocabulary_streams.py (its server's flags)."""
    vocab = _vocab_size(tiny_model_dirs["llama"])
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        capped.chat.completions.create(model="tiny", messages=messages, max_tokens=1, logprobs=True, top_logprobs=-1)
    refusal = "Requested {} logprobs of " + f"{vocab}, which is greater than max allowed: {CAP}"
    assert err.value.body["message"] == refusal.format("sample")
    assert err.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as err:
        capped.completions.create(model="tiny", prompt="Hello", max_tokens=1, extra_body={"prompt_logprobs": -1})
    assert err.value.body["message"] == refusal.format("prompt")
    with pytest.raises(openai.BadRequestError) as err:  # the Responses API's top_logprobs, as chat's
        capped.responses.create(model="tiny", input="Hi", max_output_tokens=1, top_logprobs=-1,
                                include=["message.output_text.logprobs"])
    assert err.value.body["message"] == refusal.format("sample")
    for call in (lambda: capped.completions.create(model="tiny", prompt="Hello", max_tokens=1, logprobs=-1),
                 lambda: capped.chat.completions.create(model="tiny", messages=messages, max_tokens=1, logprobs=True,
                                                        top_logprobs=-2)):
        with pytest.raises(openai.BadRequestError):
            call()
    assert manifest_server.metric("vllm:kv_cache_usage_perc") == 0

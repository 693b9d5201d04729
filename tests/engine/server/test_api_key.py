"""The API key: an empty one never means "no authentication", and a Secret's trailing newline is trimmed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from .conftest import start_server, stop_server

KEY = "s3cret-key"


def test_an_empty_api_key_stops_the_server_process_with_status_2(tiny_model_dirs):
    # The process, once: the other empty keys below go through the same `main` in this process (a process each
    # cost CI an import of torch).
    cmd = [sys.executable, "-m", "flotilla.engine.server", str(tiny_model_dirs["llama"]), "--port", "0",
           "--api-key", ""]
    environment = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "API key is empty" in result.stderr


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        ((), {"VLLM_API_KEY": ""}),  # a Secret with token: ""
        ((), {"VLLM_API_KEY": " \n"}),  # whitespace only: empty once trimmed
        (("--api-key", "\t"), {}),
        (("--api-key", KEY, " "), {}),  # one of several keys
    ],
)
def test_an_empty_api_key_refuses_to_start(tiny_model_dirs, flags, env, monkeypatch, capsys):
    from flotilla.engine.server.cli import main

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([str(tiny_model_dirs["llama"]), "--port", "0", *flags]) == 2
    assert "API key is empty" in capsys.readouterr().err


@pytest.mark.parametrize("value", [
    '{\n  "api_key": "s3cret-key"\n}\n',  # a pretty-printed JSON Secret: "{" would be a key anyone guesses
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n",  # a PEM file
    "s3cret-key\nshort\n",  # one key too short to be a key of a list
])
def test_an_environment_key_of_several_lines_that_are_not_keys_refuses_to_start(tiny_model_dirs, value, monkeypatch,
                                                                                 capsys):
    # Read one key a line, such a value would accept its guessable lines; vLLM's one-key reading failed closed.
    from flotilla.engine.server.cli import main

    monkeypatch.setenv("VLLM_API_KEY", value)
    assert main([str(tiny_model_dirs["llama"]), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "VLLM_API_KEY holds" in err and "is not a key" in err
    assert "BEGIN" not in err and "s3cret" not in err and "short" not in err  # never the secret's text


OLD_KEY, NEW_KEY, ENV_KEY = KEY, "n3w-key-2026", "env-key-2026"


@pytest.fixture(scope="module")
def two_key_server(tiny_model_dirs, tmp_path_factory):
    """One server for the two flags below: --api-key with two keys beside VLLM_API_KEY, and --disable-fastapi-docs
    (written after the keys' list, which ends at the next flag). The second key ends in a newline, as a key read from
    a Secret's file does (`kubectl create secret generic k --from-file=token=key.txt` keeps it): the flag's keys are
    trimmed."""
    server = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("two-keys") / "server.log",
                          "--served-model-name", "tiny", "--api-key", OLD_KEY, NEW_KEY + "\n",
                          "--disable-fastapi-docs", env={"VLLM_API_KEY": ENV_KEY})
    yield server
    stop_server(server)


def test_several_keys_are_each_accepted_and_replace_the_environment_key(two_key_server):
    # vLLM's --api-key takes a list (any key is let in: an old and a new key while clients move over). Here it took
    # one, so `--api-key OLD NEW` read NEW as MODEL and did not start ("model NEW: no config.json"). The flag's
    # keys replace VLLM_API_KEY, as vLLM's.
    server, old, new, env_key = two_key_server, OLD_KEY, NEW_KEY, ENV_KEY
    for key in (old, new):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
        tokenized = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hi"},
                               headers={"Authorization": f"Bearer {key}"})
        assert tokenized.status_code == 200, key
    assert httpx.get(f"{server.url}/v1/models").status_code == 401  # no key at all
    for wrong in (env_key, f"{old} {new}", old + new, "n3w"):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=wrong, max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as refused:
            client.models.list()
        assert refused.value.body["code"] == "invalid_api_key", wrong
    assert httpx.get(f"{server.url}/health").status_code == 200  # the probes stay open


def test_disable_fastapi_docs_serves_no_schema(two_key_server, prefixed_server):
    # vLLM's --disable-fastapi-docs (no /openapi.json, /docs, /redoc) was not a flag here: the server did not start.
    assert httpx.get(f"{two_key_server.url}/openapi.json").status_code == 404  # public path, nothing there
    for page in ("/docs", "/redoc"):  # never served: 404 with the key (401 without, as any unknown path)
        assert httpx.get(f"{two_key_server.url}{page}",
                         headers={"Authorization": f"Bearer {OLD_KEY}"}).status_code == 404
    assert httpx.get(f"{prefixed_server.url}/openapi.json").json()["info"]["title"] == "Flotilla"  # by default


@pytest.mark.parametrize("flag", ["--api-key", "--served-model-name"])
def test_model_after_a_list_flag_is_a_usage_error_not_the_embedded_model(tiny_model_dirs, flag, capsys):
    # `--api-key KEY MODEL`: the flag takes every word after it (as vLLM's), so MODEL became a key and the embedded
    # model would have been served under it. Refused before anything loads, naming the path.
    from flotilla.engine.server.cli import main

    model = str(tiny_model_dirs["llama"])
    with pytest.raises(SystemExit) as exited:
        # (the bad port: should the path be taken as MODEL, main returns at its check instead of serving)
        main(["--port", "70000", flag, "k", model])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"{flag} took {model!r} as one of its values, and no MODEL was given" in error
    assert f"--model {model}" in error


# A Secret of several keys, one a line (kubectl create secret --from-file keeps the file's last newline; a CRLF file)
SECRET_KEYS = f"{KEY}\r\n{NEW_KEY}\n\n{ENV_KEY}\n"


@pytest.fixture(scope="module")
def prefixed_server(tiny_model_dirs, tmp_path_factory):
    """One server for the tests below (a start each cost CI ~10 s): three keys from the environment, --root-path /api
    and --enable-server-load-tracking."""
    server = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("prefixed") / "server.log",
                          "--served-model-name", "tiny", "--root-path", "/api", "--enable-server-load-tracking",
                          env={"VLLM_API_KEY": SECRET_KEYS})
    yield server
    stop_server(server)


def test_root_path_serves_the_api_behind_a_prefix_stripping_proxy_with_the_same_key_rules(prefixed_server):
    # vLLM's --root-path (FastAPI's root_path: a proxy serves the API under a prefix and strips it; uvicorn puts the
    # prefix back in the ASGI path): not a flag here, so `vllm serve --root-path /api` did not start. The key check
    # must look below the prefix, or every path would miss "/v1" and go unchecked.
    server = prefixed_server
    key = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server.url}/health").status_code == 200  # public, as the proxy forwards it
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    for bad in ("Bearer", "Bearer s3cret", f"Bearer {KEY}x", KEY):
        assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": bad}).status_code == 401, bad
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "Hi"}).status_code == 401
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "Hi"}, headers=key).status_code == 200
    assert httpx.get(f"{server.url}/openapi.json").json()["servers"] == [{"url": "/api"}]  # links under the prefix
    # /invocations hands a body on to its route under the same prefix (the router matches below root_path)
    assert httpx.post(f"{server.url}/invocations", json={"prompt": "Hi"}).status_code == 401
    invoked = httpx.post(f"{server.url}/invocations", json={"prompt": "Hi", "max_tokens": 2}, headers=key, timeout=60)
    assert invoked.status_code == 200 and invoked.json()["usage"]["completion_tokens"] == 2, invoked.text
    assert "API key: required on every path but /health" in server.log.read_text()


def test_load_counts_requests_in_progress_with_server_load_tracking(prefixed_server):
    # vLLM's GET /load ({"server_load": N}, public) and --enable-server-load-tracking: neither was here (404, and the
    # flag did not start the server).
    server = prefixed_server
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}
    # 8 x 60 tokens: seconds of work (8 x 240 took 65 s on a quiet 2-core machine and ran past the client's
    # 120 s timeout at load 12), still hundreds of /load polls in it.
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 60, "n": 8, "ignore_eos": True}
    work = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/completions", json=body, timeout=120,
                                                      headers={"Authorization": f"Bearer {KEY}"}))
    work.start()
    seen = set()
    while work.is_alive():
        seen.add(httpx.get(f"{server.url}/load").json()["server_load"])
        time.sleep(0.02)
    work.join()
    assert 1 in seen and max(seen) == 1, seen  # the one completions request, while it ran
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}


def test_the_environment_key_holds_several_keys_one_a_line(prefixed_server):
    # The operator sets VLLM_API_KEY from apiKeySecretRef: a Secret of several lines is several keys, each let in
    # (vLLM's --api-key list, through the one variable a Secret can set), so a key can be rotated in the Secret.
    server = prefixed_server
    for key in (KEY, NEW_KEY, ENV_KEY):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"], key
    for wrong in (f"{KEY} {NEW_KEY}", KEY + NEW_KEY, "n3w", "env-ke"):  # never the lines joined, nor a part of one
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=wrong, max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as refused:
            client.models.list()
        assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key", wrong

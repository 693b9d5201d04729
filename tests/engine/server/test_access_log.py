"""uvicorn's access log as `vllm serve` keeps it: on by default, a line per HTTP request on stdout, none for the paths
of --disable-access-log-for-endpoints (exactly, without the query string). --disable-uvicorn-access-log: see
test_vllm_manifest_flags.py."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from .conftest import API_KEY

# uvicorn's access line at INFO, as vLLM writes it: 'INFO:     127.0.0.1:5555 - "POST /v1/... HTTP/1.1" 200 OK'.
LINE = re.compile(r'^INFO:     127\.0\.0\.1:\d+ - "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/1\.1" (?P<status>\d{3})')


@pytest.fixture
def logged_server(flags_server):
    """The session's `flags_server` (conftest.py): uvicorn at INFO (vLLM's default level; start_server quiets it to
    warning, and the later flag wins), /health and /metrics left out of the access log."""
    return flags_server


def _access_lines_until(server, marker: str, deadline_s: float = 60) -> list[tuple[str, str, str]]:
    """(method, path, status) of every access line, once the one of GET `marker` is written. Lines are written in
    the order the responses start, so every request answered before the marker's has its line (or none) by then."""
    httpx.get(f"{server.url}{marker}", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    end = time.monotonic() + deadline_s
    while True:
        lines = [m.group("method", "path", "status") for line in server.log.read_text().splitlines()
                 if (m := LINE.match(line))]
        if ("GET", marker, "200") in lines or time.monotonic() > end:
            return lines


def test_each_request_leaves_one_access_line_by_default(logged_server):
    # Counted from here: the server is shared, and other tests' requests have lines too.
    before = _access_lines_until(logged_server, "/v1/models?marker=before-default")
    client = openai.OpenAI(base_url=f"{logged_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert chat.choices[0].message.content is not None
    # Streams of 12 tokens each: one line a request, whatever the tokens (never a cost per token).
    for _ in range(2):
        chunks = list(client.completions.create(model="tiny", prompt="Once", max_tokens=12, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        assert chunks[-1].usage.completion_tokens == 12
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{logged_server.url}/v1", api_key="wrong", max_retries=0).models.list()
    lines = _access_lines_until(logged_server, "/v1/models?marker=default")[len(before):]
    assert lines.count(("POST", "/v1/chat/completions", "200")) == 1, lines
    assert lines.count(("POST", "/v1/completions", "200")) == 2, lines
    assert ("GET", "/v1/models", "401") in lines, lines


def test_the_paths_named_leave_no_line_matched_as_vllm(logged_server):
    for path, status in (("/health", 200), ("/metrics", 200), ("/health?probe=1", 200), ("/metrics?name[]=x", 200),
                         ("/health/", 307), ("/healthz", 401), ("/ping", 200)):
        assert httpx.get(f"{logged_server.url}{path}", timeout=60).status_code == status, path
    lines = _access_lines_until(logged_server, "/v1/models?marker=paths")
    paths = [path for _, path, _ in lines]
    # Exact paths, the query string left out (vLLM's filter): /health/ and /healthz are other paths.
    assert not [p for p in paths if p.split("?")[0] in ("/health", "/metrics")], paths
    assert "/health/" in paths and "/healthz" in paths and "/ping" in paths, paths

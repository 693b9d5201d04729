"""Chat templates sent by clients: refused by default; with --trust-request-chat-template, rendered in a
bounded sandbox in a child process of its own (memory-capped, killed at the deadline), so that a hostile
template fails its own request and nothing else."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import API_KEY, Server, start_tiny_server, stop_server, wait_until_idle

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Hello there"}]
# 10^8 iterations of nothing: runs to the render deadline. Each range stays under the sandbox's size cap (the
# prompt-character budget, 20,736 at the test servers' 256-token context), which refuses larger ones at once.
NESTED_LOOP = "{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}"


def _chat(server: Server, timeout: float = 60, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=timeout)


@pytest.fixture(scope="module")
def trusting_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("trusting") / "server.log",
                          "--trust-request-chat-template")
    yield s
    stop_server(s)


@pytest.mark.parametrize(
    "fields",
    [
        {"chat_template": "{{ messages[0].content }}"},
        {"chat_template_kwargs": {"chat_template": "{{ messages[0].content }}"}},
        {"chat_template": NESTED_LOOP},
    ],
)
def test_a_request_template_is_refused_by_default(server, fields):
    response = _chat(server, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    # Refused, not rendered: the policy's message (a render of NESTED_LOOP would end at the deadline's).
    assert "--trust-request-chat-template" in error["message"] and error["type"] == "BadRequestError"


def test_template_kwargs_are_variables_never_renderer_arguments(server):
    # tokenize=True would make the renderer return token ids instead of text.
    refused = _chat(server, chat_template_kwargs={"tokenize": True})
    assert refused.status_code == 400 and "tokenize" in refused.json()["error"]["message"]
    # A plain variable (e.g. Qwen3's enable_thinking) is fine.
    assert _chat(server, chat_template_kwargs={"enable_thinking": False}).status_code == 200


def test_a_trusted_request_template_is_rendered(trusting_server):
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}{{ suffix }}"
    response = _chat(trusting_server, chat_template=template, chat_template_kwargs={"suffix": " ::"})
    assert response.status_code == 200, response.text
    rendered = "[user] Hello there ::"
    count = httpx.post(f"{trusting_server.url}/tokenize", json={"prompt": rendered, "add_special_tokens": False},
                       headers=AUTH)
    assert response.json()["usage"]["prompt_tokens"] == count.json()["count"]


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{{ 'ab' * 50000000 }}", "exceeded a limit"),  # memory amplification
        ("{{ 'ab'|center(10**9) }}", "exceeded a limit"),
        ("{% for m in messages %}{{ m.content * 99999 }}{% endfor %}", "exceeded a limit"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),  # the sandbox refuses internals
        ("{% for x in y %}", "failed"),  # does not compile
    ],
)
def test_a_hostile_trusted_template_fails_its_own_request_fast(trusting_server, template, fragment):
    response = _chat(trusting_server, chat_template=template)
    assert response.status_code == 400, response.text
    # Stopped by its own check, not by the render deadline (5 s): fast, whatever the machine's load.
    assert fragment in response.json()["error"]["message"]
    assert "took longer than" not in response.json()["error"]["message"]
    assert _chat(trusting_server).status_code == 200


def test_a_looping_template_stops_at_the_deadline_while_health_answers(trusting_server):
    # Nested loops that print nothing and call nothing: 10^8 iterations over an 11,000-character
    # string. Rendering runs on a worker thread and is stopped at the render deadline (5 s);
    # meanwhile the event loop keeps answering.
    from flotilla.engine.server.chat_template import RENDER_TIMEOUT_S

    template = "{% set s = messages[0].content * 1000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: result.update(r=_chat(trusting_server, chat_template=template)))
    started = time.monotonic()
    worker.start()
    health_latencies = []
    while worker.is_alive():
        t0 = time.monotonic()
        assert httpx.get(f"{trusting_server.url}/health", timeout=60).status_code == 200
        health_latencies.append(time.monotonic() - t0)
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    # Stopped by the deadline (its message), not by the template's end; the deadline counts wall time from the
    # render's start, after `started`, so a loaded machine can only make `elapsed` longer.
    assert result["r"].status_code == 400 and "took longer than" in result["r"].json()["error"]["message"]
    assert elapsed > RENDER_TIMEOUT_S
    # On the event loop the render would hold /health for the whole render: nearly all of `elapsed` would be spent
    # in slow answers. On a worker thread /health only competes for the (2, shared) cores: at most a stall or two
    # of a loaded machine is slow, not half the time (compared with the run's own length, not a fixed bound).
    slow = sum(latency for latency in health_latencies if latency > 1.0)
    assert len(health_latencies) >= 3 and slow < elapsed / 2, (elapsed, health_latencies)


# --- the renderer alone (no server) ----------------------------------------------------------------


def test_request_template_policy_follows_the_flag():
    from flotilla.engine.server.chat_template import request_template

    assert request_template(None, {"enable_thinking": True}, trusted=False) is None
    for args in (("{{ x }}", None), (None, {"chat_template": "{{ x }}"})):
        with pytest.raises(ValueError, match="--trust-request-chat-template"):
            request_template(*args, trusted=False)
        assert request_template(*args, trusted=True) == "{{ x }}"


def test_untrusted_rendering_matches_a_plain_render_within_its_limits():
    from flotilla.engine.server.chat_template import render_untrusted

    template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}{{ {'a': 'é'} | tojson }}")
    context = {"messages": [{"role": "user", "content": " hi "}], "add_generation_prompt": True}
    assert render_untrusted(template, context, max_chars=1000) == '<|user|>hi<|assistant|>{"a": "é"}'


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 2000 }}",
        "{{ 'x' + 'y' * 999 + 'z' * 999 }}",
        "{{ 'x'.ljust(5000) }}",
        "{{ 'x' | center(5000) }}",
        "{{ 9 ** 99 }}",
        "{% for i in range(1000) %}{{ i }}{% endfor %}",  # output past the cap
        "{% for i in range(999) %}{% for j in range(999) %}{% for k in range(999) %}{% endfor %}{% endfor %}"
        "{% endfor %}",  # 10^9 silent iterations: the deadline
    ],
)
def test_untrusted_rendering_stops_at_its_limits(template):
    from flotilla.engine.server.chat_template import render_untrusted

    started = time.monotonic()
    with pytest.raises(ValueError, match="exceeded a limit"):
        render_untrusted(template, {}, max_chars=1000, timeout_s=0.5)
    # The deadline (0.5 s, then the kill's grace) and the fork server's first start on a loaded machine: far
    # below the minutes that 10^9 iterations would take unstopped.
    assert time.monotonic() - started < 30


def _process_status(pid: int, field: str) -> int:
    """A kB figure of /proc/<pid>/status (e.g. VmHWM, the peak resident size)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


# `~` is not checked: 20,000 characters doubled 15 times are 655 MB.
_DOUBLINGS = "{% set a = 'x' * 20000 %}" + "{% set a = a ~ a %}" * 15 + "{{ 1 }}"
# One long division of 6.6-million-bit integers: about a minute inside C, where no template line comes to stop it.
_DIVISION = "{% set a = 9 ** 64 %}" + "{% set a = a * a %}" * 15 + "{{ (a * a) // (a + 1) }}"


@pytest.mark.parametrize(
    "template",
    [
        "{{ '%0300000000d' % 1 }}",  # a printf width: 300 MB in one operation
        "{{ '{:>300000000}'.format(1) }}",  # the same through str.format
        "{{ '%0300000000d' | format(1) }}",  # and the format filter
        "{% set s = messages[0].content * 1800 %}{{ s.replace('', s) }}",  # 19,800 x 19,800 characters
        "{% set s = messages[0].content * 1000 %}{{ s.join([s] * 20000) }}",  # 11,000 x 20,000
        _DOUBLINGS,
        _DIVISION,
    ],
    ids=["percent", "str-format", "format-filter", "replace", "join", "tilde-doubling", "long-division"],
)
def test_a_trusted_template_cannot_grow_the_server_or_outrun_the_deadline(trusting_server, template):
    from flotilla.engine.server.chat_template import RENDER_KILL_GRACE_S, RENDER_TIMEOUT_S

    pid = trusting_server.process.pid  # the API process, which renders request templates
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets its peak resident size (VmHWM) to the current one
    peak_before = _process_status(pid, "VmHWM")
    started = time.monotonic()
    response = _chat(trusting_server, timeout=60, chat_template=template)
    elapsed = time.monotonic() - started
    assert response.status_code == 400, response.text
    assert "chat template" in response.json()["error"]["message"]
    # The render deadline (5 s) and the kill's grace (2 s), with room for a loaded machine: unstopped, the long
    # division alone runs over 90 s (measured), and the client would give up at 60 s.
    assert elapsed < RENDER_TIMEOUT_S + RENDER_KILL_GRACE_S + 20
    grown_mb = (_process_status(pid, "VmHWM") - peak_before) / 1024
    assert grown_mb < 100, f"the API process's peak memory grew {grown_mb:.0f} MB"
    # Nothing still computing after the answer, in the API process or a render child (CPU time, not wall time: the
    # long division would keep one busy for over a minute).
    assert wait_until_idle(pid, deadline_s=30), "the server was still computing 30 s after the answer"
    assert _chat(trusting_server).status_code == 200


# --- continue_final_message (vLLM's field: the model continues the last message instead of starting a turn) --


PREFILL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]


def _prompt_tokens(server: Server, **fields) -> int:
    response = _chat(server, messages=PREFILL, max_tokens=1, temperature=0, **fields)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


def test_continue_final_message_ends_the_prompt_inside_the_last_message(server, tiny_model_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    text = tokenizer.apply_chat_template(PREFILL, tokenize=False, continue_final_message=True)
    assert text.endswith("The colour is")
    expected = len(tokenizer.encode(text, add_special_tokens=False))
    assert _prompt_tokens(server, continue_final_message=True, add_generation_prompt=False) == expected
    # Without it the last message is closed and a new assistant turn opened: a longer prompt.
    assert _prompt_tokens(server) > expected


def test_continue_final_message_with_a_trusted_request_template(trusting_server):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    expected = "<user>Name a colour.</user><assistant>The colour is"
    count = httpx.post(f"{trusting_server.url}/tokenize", json={"prompt": expected, "add_special_tokens": False},
                       headers=AUTH)
    tokens = _prompt_tokens(trusting_server, chat_template=template, continue_final_message=True,
                            add_generation_prompt=False)
    assert tokens == count.json()["count"]


def test_continue_final_message_with_add_generation_prompt_is_a_400(server):
    response = _chat(server, messages=PREFILL, continue_final_message=True)  # add_generation_prompt: true by default
    assert response.status_code == 400, response.text
    assert "continue_final_message" in response.json()["error"]["message"]


def test_concurrent_trusted_renders_are_bounded_in_number(trusting_server):
    # Each request template renders in a child capped at 256 MiB plus 16 B a prompt character, but nothing bounded
    # how many children ran at once: every worker thread of the server could hold one (6 here, 20 on a 16-core
    # pod; more children, more memory), and slow templates held the threads that tokenization needs too.
    import psutil

    from flotilla.engine.server.chat_template import MAX_CONCURRENT_RENDERS

    api = psutil.Process(trusting_server.process.pid)
    assert _chat(trusting_server, chat_template="{{ messages[0].content }}").status_code == 200  # the fork server
    forkserver = next(p for p in api.children() if "forkserver" in " ".join(p.cmdline()))
    requests = 2 * MAX_CONCURRENT_RENDERS
    results: list[tuple[int, str]] = []

    def slow() -> None:  # runs to the render deadline (5 s), then 400
        response = _chat(trusting_server, timeout=120, chat_template=NESTED_LOOP)
        results.append((response.status_code, response.json()["error"]["message"]))

    threads = [threading.Thread(target=slow) for _ in range(requests)]
    for t in threads:
        t.start()
    most = 0
    while any(t.is_alive() for t in threads):
        most = max(most, len(forkserver.children()))
        time.sleep(0.05)
    for t in threads:
        t.join()
    # Every render ran to its deadline (each child lived seconds, so the polling above saw them): a template
    # refused at once by a size check would leave no child to count.
    assert [(code, "took longer than" in message) for code, message in results] == [(400, True)] * requests, results
    assert 0 < most <= MAX_CONCURRENT_RENDERS, most
    assert _chat(trusting_server).status_code == 200


TOOL_TEMPLATE = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                 "{% if tools %} tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{% endif %}")
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_tool_choice_none_still_shows_the_tools_to_the_template_as_vllm(trusting_server):
    # vLLM renders a request's tools whatever its tool_choice (unless --exclude-tools-when-tool-choice-none): with
    # "none" the model still sees them, it is only not asked to call one.
    def prompt_tokens(**fields) -> int:
        response = _chat(trusting_server, chat_template=TOOL_TEMPLATE, **fields)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    rendered = httpx.post(f"{trusting_server.url}/tokenize", headers=AUTH,
                          json={"prompt": "Hello there tools: get_weather", "add_special_tokens": False}).json()
    assert prompt_tokens(tools=WEATHER, tool_choice="none") == rendered["count"]
    assert prompt_tokens() < rendered["count"]


def test_the_flag_excludes_the_tools_of_a_tool_choice_none_request():
    from flotilla.engine.server.protocol import ChatCompletionRequest
    from flotilla.engine.server.tool_calls import plan_tools

    req = ChatCompletionRequest(messages=MESSAGES, tools=WEATHER, tool_choice="none")
    assert plan_tools(req, False, None).template_tools == WEATHER
    assert plan_tools(req, False, None, exclude_tools_when_tool_choice_none=True).template_tools is None
    auto = ChatCompletionRequest(messages=MESSAGES, tools=WEATHER, tool_choice="required")
    assert plan_tools(auto, False, None, exclude_tools_when_tool_choice_none=True).template_tools == WEATHER


def test_tokenize_renders_a_conversations_tools_and_template_variables_as_chat_does(trusting_server):
    # vLLM's /tokenize takes a conversation's tools, chat_template and chat_template_kwargs: its count is then the
    # chat request's prompt_tokens (they were ignored here, so the count missed the rendered tools).
    template = TOOL_TEMPLATE + "{{ suffix }}"
    fields = {"tools": WEATHER, "chat_template": template, "chat_template_kwargs": {"suffix": " ::"}}
    chat = _chat(trusting_server, tool_choice="none", **fields)
    assert chat.status_code == 200, chat.text
    counted = httpx.post(f"{trusting_server.url}/tokenize", headers=AUTH, json={"messages": MESSAGES, **fields})
    assert counted.status_code == 200, counted.text
    assert counted.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    rendered = httpx.post(f"{trusting_server.url}/tokenize", headers=AUTH,
                          json={"prompt": "Hello there tools: get_weather ::", "add_special_tokens": False}).json()
    assert counted.json()["tokens"] == rendered["tokens"]


def test_documents_reach_the_template_as_vllm_passes_them(trusting_server):
    # vLLM's chat field for RAG templates (Command R, Granite): `documents`, a template variable of that name.
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{% for d in documents %} [{{ d.title }}]{% endfor %}"
    docs = [{"title": "tides", "text": "..."}, {"title": "charts", "text": "..."}]
    response = _chat(trusting_server, chat_template=template, documents=docs)
    assert response.status_code == 200, response.text
    rendered = httpx.post(f"{trusting_server.url}/tokenize", headers=AUTH,
                          json={"prompt": "Hello there [tides] [charts]", "add_special_tokens": False}).json()
    assert response.json()["usage"]["prompt_tokens"] == rendered["count"]

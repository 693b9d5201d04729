"""vLLM's --chat-template (a file or the template's text) and --default-chat-template-kwargs, on real servers: the
operator's template replaces the tokenizer's for chat, /tokenize with messages, the Responses API and /v1/embeddings
with messages, and its default variables sit under each request's chat_template_kwargs."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from flotilla.engine.server.server_chat_template import (
    load_chat_template,
    merged_template_kwargs,
    request_template_kwargs,
)

from .conftest import API_KEY, start_tiny_server, stop_server

openai = pytest.importorskip("openai")

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
# Nothing like the tiny models' own (ChatML) template, so a prompt rendered by it shows which template ran.
TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}: {{ m['content'] }}>>{% endfor %}"
            "{% if add_generation_prompt %}[reply as {{ persona }}]{% endif %}"
            "{% if reasoning_effort is defined %}(effort {{ reasoning_effort }}){% endif %}"
            "{% if enable_thinking is defined %}(thinking {{ enable_thinking }}){% endif %}")
DEFAULTS = '{"persona": "a sailor"}'
MESSAGES = [{"role": "user", "content": "hi"}]


def rendered(persona: str, generation_prompt: bool = True) -> str:
    return "<<user: hi>>" + (f"[reply as {persona}]" if generation_prompt else "")


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)


def test_a_readable_file_is_read_and_text_with_template_marks_is_the_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE  # not a file, and holds {: the template itself
    assert load_chat_template("line one\nline two") == "line one\nline two"
    assert load_chat_template(None) is None


@pytest.mark.parametrize("value", ["no/such/template.jinja", "/", "bad\0path"])
def test_a_path_like_value_that_cannot_be_read_is_refused(value):
    with pytest.raises(ValueError, match="looks like a file path, but it could not be read"):
        load_chat_template(value)


def test_request_kwargs_win_over_the_defaults_unless_null_or_auto():
    defaults = {"persona": "a sailor", "enable_thinking": False}
    assert merged_template_kwargs(defaults, {"persona": "a pilot"}) == {"persona": "a pilot", "enable_thinking": False}
    assert merged_template_kwargs(defaults, {"persona": None, "enable_thinking": "auto", "x": 1}) == {**defaults,
                                                                                                       "x": 1}
    assert merged_template_kwargs(None, {"persona": None}) == {"persona": None}  # no defaults: the request's own
    assert merged_template_kwargs(defaults, None) == defaults


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("server-template")
    (root / "template.jinja").write_text(TEMPLATE)
    s = start_tiny_server(tiny_model_dirs["llama"], root / "server.log",
                          "--chat-template", str(root / "template.jinja"), "--default-chat-template-kwargs", DEFAULTS)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])


def tokens(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_tokenize_renders_messages_with_the_servers_template_and_defaults(server, tokenizer):
    answer = post(server, "/tokenize", {"model": "tiny", "messages": MESSAGES})
    assert answer.status_code == 200, answer.text
    assert answer.json()["tokens"] == tokens(tokenizer, rendered("a sailor"))
    mine = post(server, "/tokenize", {"model": "tiny", "messages": MESSAGES,
                                      "chat_template_kwargs": {"persona": "a pilot"}})
    assert mine.json()["tokens"] == tokens(tokenizer, rendered("a pilot"))
    unset = post(server, "/tokenize", {"model": "tiny", "messages": MESSAGES,
                                       "chat_template_kwargs": {"persona": None}})
    assert unset.json()["tokens"] == tokens(tokenizer, rendered("a sailor"))


def test_chat_and_responses_prompts_are_the_servers_template(server, tokenizer):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert chat.usage.prompt_tokens == len(tokens(tokenizer, rendered("a sailor")))
    pilot = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                           extra_body={"chat_template_kwargs": {"persona": "a harbour pilot"}})
    assert pilot.usage.prompt_tokens == len(tokens(tokenizer, rendered("a harbour pilot")))
    response = client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    assert response.usage.input_tokens == len(tokens(tokenizer, rendered("a sailor")))


def test_a_template_kwarg_naming_a_renderer_argument_is_refused_at_start(tiny_model_dirs, monkeypatch, capsys):
    # The server's `main` in this process (a process each cost CI an import of torch, ~5 s): a flag taken by mistake
    # fails here at once instead of starting an engine.
    from flotilla.engine.server import cli

    def no_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("the flags were taken: the engine would start")

    monkeypatch.setattr(cli, "_start_engine", no_engine)
    for flags in (["--default-chat-template-kwargs", '{"tokenize": true}'],
                  ["--default-chat-template-kwargs", "[1]"],
                  ["--chat-template", "no/such/template.jinja"]):
        try:
            status = cli.main([str(tiny_model_dirs["llama"]), *flags])
        except SystemExit as exc:  # a parser error
            status = exc.code
        err = capsys.readouterr().err
        assert status == 2, err
        assert "--chat-template" in err or "--default-chat-template-kwargs" in err, err


def test_embeddings_of_messages_use_the_inline_template(tiny_model_dirs, tmp_path):
    # The template's text itself as the flag's value (what the operator allows), on a pooling server.
    s = start_tiny_server(tiny_model_dirs["qwen3"], tmp_path / "server.log", "--runner", "pooling",
                          "--chat-template", TEMPLATE, "--default-chat-template-kwargs", DEFAULTS)
    try:
        qwen = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen3"])
        by_messages = post(s, "/v1/embeddings", {"model": "tiny", "messages": MESSAGES, "encoding_format": "float"})
        assert by_messages.status_code == 200, by_messages.text
        ids = tokens(qwen, rendered("a sailor", generation_prompt=False))  # embeddings: no generation prompt
        assert by_messages.json()["usage"]["prompt_tokens"] == len(ids)
        by_ids = post(s, "/v1/embeddings", {"model": "tiny", "input": [ids], "encoding_format": "float"})
        assert by_messages.json()["data"][0]["embedding"] == pytest.approx(by_ids.json()["data"][0]["embedding"],
                                                                           abs=1e-5)
    finally:
        stop_server(s)


def test_responses_reasoning_effort_is_the_templates_reasoning_effort_as_vllm(server, tokenizer):
    # vLLM passes a Responses request's reasoning.effort to the chat template as `reasoning_effort` (templates such as
    # gpt-oss's and Qwen's read it); it changed nothing here. No effort: no variable (the defaults' persona stays).
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    high = client.responses.create(model="tiny", input="hi", max_output_tokens=1, reasoning={"effort": "high"})
    assert high.usage.input_tokens == len(tokens(tokenizer, rendered("a sailor") + "(effort high)"))
    assert high.reasoning.effort == "high"
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=1, reasoning={"summary": "auto"})
    assert plain.usage.input_tokens == len(tokens(tokenizer, rendered("a sailor")))


def test_chat_reasoning_effort_is_the_templates_reasoning_effort_over_the_requests_kwargs_as_vllm(server, tokenizer):
    # vLLM's chat request: a top-level reasoning_effort goes to the template as `reasoning_effort` (over the request's
    # chat_template_kwargs) and sets `enable_thinking` (false for "none") unless those kwargs name it; it was ignored.
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def prompt_tokens(**fields) -> int:
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, **fields)
        return reply.usage.prompt_tokens

    assert prompt_tokens(reasoning_effort="high") == len(tokens(tokenizer, rendered("a sailor")
                                                                + "(effort high)(thinking True)"))
    assert prompt_tokens(reasoning_effort="none") == len(tokens(tokenizer, rendered("a sailor")
                                                                + "(effort none)(thinking False)"))
    mine = {"chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": False}}
    assert prompt_tokens(reasoning_effort="low", extra_body=mine) == len(tokens(tokenizer, rendered("a sailor")
                                                                               + "(effort low)(thinking False)"))
    kwargs_only = {"chat_template_kwargs": {"reasoning_effort": "medium"}}
    assert prompt_tokens(extra_body=kwargs_only) == len(tokens(tokenizer, rendered("a sailor") + "(effort medium)"))
    assert prompt_tokens(extra_body={"reasoning_effort": None}) == len(tokens(tokenizer, rendered("a sailor")))
    bad = post(server, "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "reasoning_effort": "extreme"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort", bad.text


def test_request_template_kwargs_put_the_effort_over_the_requests_own():
    assert request_template_kwargs(None, None) is None
    assert request_template_kwargs({"x": 1}, None) == {"x": 1}
    assert request_template_kwargs(None, "low") == {"reasoning_effort": "low", "enable_thinking": True}
    assert request_template_kwargs({"reasoning_effort": "high", "enable_thinking": None}, "none") == {
        "reasoning_effort": "none", "enable_thinking": None}  # null: the server's default, as vLLM

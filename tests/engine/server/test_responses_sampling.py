"""/v1/responses serves vLLM's sampling and output fields of its Responses request (presence/frequency penalties,
logit_bias, stop, ignore_eos, skip_special_tokens, include_stop_str_in_output, structured_outputs) as chat completions
serves them, and `truncation: "auto"` as vLLM: the input's last max_model_len - max_output_tokens tokens. Each was
accepted with any type and ignored before. Real server (tiny model, 256-token context), the openai SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY

QUESTION = [{"role": "user", "content": "Name a colour of the sea."}]


def _chat(client, max_tokens: int = 8, **extra):
    return client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=max_tokens, temperature=0,
                                          extra_body=extra or None)


def _respond(client, max_output_tokens: int = 8, **extra):
    return client.responses.create(model="tiny", input=QUESTION, max_output_tokens=max_output_tokens, temperature=0,
                                   store=False, extra_body=extra or None)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


def _token_id(server, text: str) -> int:
    [token] = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    return token


def test_penalties_sample_as_chats_and_are_bounded_as_vllms(client):
    plain = _chat(client, 24).choices[0].message.content
    penalized = _chat(client, 24, frequency_penalty=2.0, presence_penalty=2.0).choices[0].message.content
    assert penalized != plain  # the penalties change this answer (else the check below proves nothing)
    assert _respond(client, 24, frequency_penalty=2.0, presence_penalty=2.0).output_text == penalized
    assert _respond(client, 24, frequency_penalty=None, presence_penalty=None).output_text == plain
    for field in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(openai.BadRequestError, match=field):
            _respond(client, 2, **{field: 2.5})


def test_logit_bias_ignore_eos_and_skip_special_tokens_apply(client, server):
    word, eos = _token_id(server, " harbour"), _token_id(server, "<|im_end|>")  # the tokenizer's end token
    forced = _respond(client, 4, logit_bias={str(word): 100})
    assert forced.output_text == _chat(client, 4, logit_bias={str(word): 100}).choices[0].message.content
    assert forced.output_text == " harbour" * 4
    # A forced end token ends the response at once; with ignore_eos it runs to max_output_tokens.
    ended = _respond(client, 6, logit_bias={str(eos): 100})
    assert ended.status == "completed" and ended.usage.output_tokens == 1 and ended.output_text == ""
    ignored = _respond(client, 6, logit_bias={str(eos): 100}, ignore_eos=True)
    assert ignored.status == "incomplete" and ignored.usage.output_tokens == 6
    assert ignored.output_text == ""  # the end tokens are special: skipped from the text
    shown = _respond(client, 3, logit_bias={str(eos): 100}, ignore_eos=True, skip_special_tokens=False)
    assert shown.output_text == "<|im_end|>" * 3


def test_stop_ends_the_text_as_chats_and_include_stop_str_keeps_it(client):
    whole = _chat(client, 16).choices[0].message.content
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    cut = _chat(client, 16, stop=[stop]).choices[0].message.content
    assert len(cut) < len(whole)
    stopped = _respond(client, 16, stop=[stop])
    assert stopped.output_text == cut and stopped.status == "completed"
    assert _respond(client, 16, stop=stop).output_text == cut  # one string, as vLLM's `str | list[str]`
    assert _respond(client, 16, stop=[stop], include_stop_str_in_output=True).output_text == cut + stop


def test_structured_outputs_constrain_the_answer_and_not_beside_text_format(client):
    chosen = _respond(client, 8, structured_outputs={"choice": ["turquoise", "grey"]})
    assert chosen.output_text in ("turquoise", "grey") and chosen.status == "completed"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="x", max_output_tokens=2, text={"format": {"type": "text"}},
                                extra_body={"structured_outputs": {"choice": ["a"]}})
    assert refused.value.body["param"] == "structured_outputs"
    assert "Cannot specify both structured_outputs and text.format" in refused.value.body["message"]


@pytest.mark.parametrize(("field", "value"), [
    ("logit_bias", [1]), ("stop", 5), ("ignore_eos", "sure"), ("skip_special_tokens", "maybe"),
    ("include_stop_str_in_output", []), ("structured_outputs", "json"), ("prompt_cache_key", 5),
    ("mm_processor_kwargs", 5), ("media_io_kwargs", {"image": 5}), ("include_reasoning", "maybe"),
])
def test_vllms_fields_of_the_wrong_type_are_a_400_naming_them(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="x", max_output_tokens=2, extra_body={field: value})
    assert field in refused.value.body["message"]


def test_prompt_cache_key_and_text_only_multimodal_kwargs_are_accepted(client):
    # vLLM ignores prompt_cache_key; the multimodal kwargs would shape media, which this route does not read
    served = client.responses.create(model="tiny", input="x", max_output_tokens=2, store=False, prompt_cache_key="k",
                                     extra_body={"mm_processor_kwargs": {"fps": 1}, "media_io_kwargs": {}})
    assert served.status in ("completed", "incomplete")


LONG = "The sea is wide and the harbour is calm tonight. " * 30  # ~330 tokens: past the 256-token context


def test_truncation_auto_keeps_the_inputs_last_tokens_that_leave_max_output_tokens(client, server):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model="tiny", input=LONG, max_output_tokens=4)  # truncation "disabled"
    cut = client.responses.create(model="tiny", input=LONG, max_output_tokens=4, temperature=0, truncation="auto")
    assert cut.truncation == "auto" and cut.usage.input_tokens == 256 - 4
    # The tail is kept: the same answer as chat's truncate_prompt_tokens of that many tokens (vLLM's -1)
    chat = _post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": LONG}],
                                                 "max_tokens": 4, "temperature": 0, "truncate_prompt_tokens": 252})
    assert chat.status_code == 200, chat.text
    assert cut.output_text == chat.json()["choices"][0]["message"]["content"]
    short = [client.responses.create(model="tiny", input="x", max_output_tokens=4, truncation=how).usage.input_tokens
             for how in ("auto", "disabled")]
    assert short[0] == short[1]  # nothing cut from an input that fits


def test_truncation_null_is_disabled_as_openai_documents_it(client):
    # OpenAI's SDK types truncation Optional and documents "disabled" as the default; vLLM's check (`!= "disabled"`)
    # would cut on null, then fail to echo it (its response types truncation without null). docs/server.md says why.
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model="tiny", input=LONG, max_output_tokens=4, truncation=None)
    assert client.responses.create(model="tiny", input="x", max_output_tokens=2, truncation=None).truncation == \
        "disabled"


def test_a_text_past_the_character_bound_is_truncated_not_refused_when_truncation_is_asked(client, server):
    # The server refuses a text longer than max_model_len x the longest token's characters (256 x 81 here) before
    # tokenizing it: no such text fits. Cut to its tail it may, so vLLM bounds a text only when it is not truncated;
    # this one (24,000 characters) was a 400 with truncation "auto" and with chat's truncate_prompt_tokens.
    huge = "harbour " * 3000
    with pytest.raises(openai.BadRequestError, match="characters"):
        client.responses.create(model="tiny", input=huge, max_output_tokens=2)
    cut = client.responses.create(model="tiny", input=huge, max_output_tokens=2, truncation="auto", store=False)
    assert cut.usage.input_tokens == 254
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
                       ("/v1/completions", {"prompt": huge})):
        answer = _post(server, path, {"model": "tiny", "max_tokens": 2, "truncate_prompt_tokens": 200, **body})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == 200


@pytest.mark.parametrize("max_output_tokens", [None, 256, 300])
def test_truncation_auto_without_room_to_generate_is_a_400_naming_max_output_tokens(client, max_output_tokens):
    kw = {} if max_output_tokens is None else {"max_output_tokens": max_output_tokens}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=LONG, truncation="auto", **kw)
    assert refused.value.body["param"] == "max_output_tokens" and "truncation" in refused.value.body["message"]


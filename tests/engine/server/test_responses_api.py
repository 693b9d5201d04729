"""POST /v1/responses through the openai SDK's `responses.create`, streaming and not (issue 24, item 2)."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
QUESTION = "Name a colour of the sea."


def _chat_answer(client, messages: list[dict], max_tokens: int = 8) -> str:
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, temperature=0)
    return answer.choices[0].message.content


def test_text_input_answers_as_the_chat_completion_of_the_same_conversation(client):
    response = client.responses.create(model="tiny", input=QUESTION, instructions="Answer briefly.",
                                       max_output_tokens=8, temperature=0)
    expected = _chat_answer(client, [{"role": "system", "content": "Answer briefly."},
                                     {"role": "user", "content": QUESTION}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == expected
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    usage = response.usage
    assert usage.output_tokens == 8 and usage.input_tokens > 5
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # max_output_tokens reached: vLLM and OpenAI call the response incomplete
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_message_input_with_content_parts(client):
    messages = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    response = client.responses.create(model="tiny", input=messages, max_output_tokens=6, temperature=0)
    assert response.output_text == _chat_answer(client, [{"role": "user", "content": QUESTION}], 6)


def test_streaming_events_build_the_same_text(client):
    whole = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=10, temperature=0)
    stream = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=10, temperature=0,
                                     stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-4].text
    assert events[-1].response.output_text == whole.output_text


def test_sdk_stream_helper_reads_the_events(client):
    with client.responses.stream(model="tiny", input=QUESTION, max_output_tokens=5, temperature=0) as stream:
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.usage.output_tokens == 5
    assert last.response.output_text == text


def test_previous_response_id_continues_the_stored_conversation(client, server):
    first = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0)
    follow = client.responses.create(model="tiny", input="And another?", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    expected = _chat_answer(client, [{"role": "user", "content": QUESTION},
                                     {"role": "assistant", "content": first.output_text},
                                     {"role": "user", "content": "And another?"}], 4)
    assert follow.output_text == expected and follow.previous_response_id == first.id
    stored = httpx.get(f"{server.url}/v1/responses/{first.id}", headers=HEADERS).json()
    assert stored["id"] == first.id and stored["output"][0]["content"][0]["text"] == first.output_text


def test_one_x_request_id_on_two_responses_keeps_both_in_the_store(client):
    # A gateway sends one X-Request-Id again (a retry, one trace over several calls): each response
    # gets its own id, led by the caller's, and both conversations stay retrievable and continuable.
    trace = {"X-Request-Id": "trace-shared"}
    first = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=3, temperature=0,
                                    extra_headers=trace)
    second = client.responses.create(model="tiny", input="Name a fruit.", max_output_tokens=3, temperature=0,
                                     extra_headers=trace)
    assert first.id != second.id
    assert first.id.startswith("resp_trace-shared-") and second.id.startswith("resp_trace-shared-")
    assert client.responses.retrieve(first.id).output_text == first.output_text
    assert client.responses.retrieve(second.id).output_text == second.output_text
    follow = client.responses.create(model="tiny", input="And another?", previous_response_id=first.id,
                                     max_output_tokens=3, temperature=0)
    assert follow.output_text == _chat_answer(client, [{"role": "user", "content": QUESTION},
                                                       {"role": "assistant", "content": first.output_text},
                                                       {"role": "user", "content": "And another?"}], 3)
    # The body's request_id (vLLM's extra parameter) names the response exactly, as in vLLM.
    named = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=1,
                                    extra_body={"request_id": "resp_named-by-body"})
    assert named.id == "resp_named-by-body"


def test_store_false_keeps_a_response_out_of_the_store(client):
    unstored = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="more", previous_response_id=unstored.id, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_unsupported_input_is_a_400_that_names_it(client):
    # tool_choice auto (the default) needs a tool parser, as in chat; the rest of tools: test_responses_tools.py
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
        client.responses.create(model="tiny", input="x", tools=[{"type": "function", "name": "f", "parameters": {}}])
    with pytest.raises(openai.BadRequestError, match="input items of type 'file_search_call'"):
        client.responses.create(model="tiny", input=[{"type": "file_search_call", "id": "c", "queries": []}])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")


def test_an_empty_input_is_a_400_in_the_responses_words(client, server):
    """`input: []` (no instructions, no earlier response) names `input`, not the chat request built from it."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=[], max_output_tokens=3)
    assert refused.value.body["param"] == "input" and "messages" not in refused.value.body["message"]
    assert "input must not be empty" in refused.value.body["message"]
    assert server.metric("vllm:kv_cache_usage_perc") == 0
    assert client.responses.create(model="tiny", input=[], instructions="Be brief.", max_output_tokens=3).output


@pytest.mark.parametrize(("part", "named"), [
    ({"type": "input_image", "image_url": "https://example.com/a.png"}, "input[1].output[1]: content parts of type "
                                                                        "'input_image'"),
    ({"type": "input_file", "file_id": "file-1"}, "input[1].output[1]: content parts of type 'input_file'"),
    ({"type": "input_text", "text": 5}, "input[1].output[1].text must be a string"),
    ("plain", "input[1].output[1]: content parts of type 'str'"),
])
def test_a_function_call_output_part_that_is_not_text_is_a_400_naming_it(client, part, named):
    # OpenAI's function_call_output takes input_text, input_image and input_file parts; this server reads text only
    output = [{"type": "input_text", "text": "18 C"}, part]
    items = [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": output}]
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="tiny", input=items, max_output_tokens=2)
    assert named in error.value.body["message"] and error.value.body["param"] == "input"
    message = [{"role": "user", "content": [part]}]  # a message item's parts alike
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.content\[0\]"):
        client.responses.create(model="tiny", input=message, max_output_tokens=2)


def test_reasoning_input_items_become_the_assistant_messages_reasoning_as_vllm():
    """A response's output sent back as input (reasoning item, message, calls) is one assistant message whose
    `reasoning` the template reads (vLLM's mapping); encrypted reasoning is a 400 naming the input."""
    from flotilla.engine.server.errors import APIError
    from flotilla.engine.server.responses_items import input_messages

    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm"}]}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    user = {"role": "user", "content": "Sea?"}
    assert input_messages([user, thought, answer, call]) == [
        {"role": "user", "content": "Sea?"},
        {"role": "assistant", "content": answer["content"], "reasoning": "Hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    # after an answer the thinking joins it; a summary stands in for missing content; none at all is an empty one
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "S"}]}
    assert input_messages([user, answer, summary])[1]["reasoning"] == "S"
    assert input_messages([user, {"type": "reasoning", "summary": []}])[1] == {
        "role": "assistant", "content": None, "reasoning": ""}
    with pytest.raises(APIError, match="encrypted") as err:
        input_messages([user, {**thought, "encrypted_content": "gAAA"}])
    assert err.value.status == 400 and err.value.param == "input"


@pytest.mark.parametrize(("choice", "words"), [({"type": "function", "name": "paint"}, "not among the request's tools"),
                                               ("required", "needs tools"), ("bogus", "is not one of")])
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_choice_that_asks_for_a_call_without_tools_is_a_400(client, choice, words, stream):
    """Without `tools`, every tool_choice was served as `none`: a named function (vLLM: "has not been passed in
    `tools`"), `required` and a choice that is none of the kinds came back 200 with text and no call. `auto` and
    `none` (the defaults' meaning) are still served."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="x", tool_choice=choice, max_output_tokens=2, stream=stream)
    assert refused.value.body["param"] == "tool_choice" and words in refused.value.body["message"]
    for fine in ("auto", "none"):
        served = client.responses.create(model="tiny", input="x", tool_choice=fine, max_output_tokens=2)
        assert served.usage.output_tokens >= 1 and all(item.type == "message" for item in served.output)


@pytest.mark.parametrize(("field", "value"), [
    ("truncation", 5), ("truncation", "middle"), ("reasoning", 5), ("reasoning", {"effort": "extreme"}),
    ("reasoning", {"summary": 1}), ("service_tier", "gold"), ("max_tool_calls", "many"), ("background", "soon"),
])
def test_openai_fields_that_vllm_types_are_a_400_naming_them_when_of_the_wrong_type(client, field, value):
    """vLLM's request types these (OpenAI's) fields: a wrong type is a 400 naming the field, not a body served."""
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", max_output_tokens=2, extra_body={field: value})
    assert field in err.value.body["message"]


def test_openai_fields_that_vllm_types_are_served_with_their_values(client):
    response = client.responses.create(model="tiny", input="x", max_output_tokens=2, store=False, truncation="auto",
                                       reasoning={"effort": "low", "summary": "auto"}, service_tier="flex",
                                       max_tool_calls=3, background=False)
    assert response.status in ("completed", "incomplete") and response.truncation == "auto"
    assert response.reasoning.effort == "low" and response.service_tier == "flex" and response.max_tool_calls == 3
    assert client.responses.create(model="tiny", input="x", max_output_tokens=2, store=False).truncation == "disabled"


@pytest.mark.parametrize(("body", "param"), [
    ({"background": True}, "background"),  # vLLM runs it as a task polled with GET: not answered in the request
    ({"background": True, "store": False}, "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),  # vLLM: "prompt template is not supported"
])
@pytest.mark.parametrize("stream", [False, True])
def test_background_and_prompt_are_a_400_naming_them(client, server, body, param, stream):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", max_output_tokens=2, stream=stream, extra_body=body)
    assert err.value.body["param"] == param
    assert server.metric("vllm:kv_cache_usage_perc") == 0


@pytest.mark.parametrize(("field", "value", "off"), [
    # gpt-oss Harmony messages / a response whose Harmony state rides in encrypted_content: vLLM reads them on its
    # gpt-oss path only and dropped them unsaid on the chat-template path, the only path here
    ("previous_input_messages", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], []),
    ("previous_response", {"id": "resp_1", "object": "response", "output": []}, None),
    ("vllm_xargs", {"target_token": 7}, {}),  # for custom extensions: this server loads none (as chat's)
    ("kv_transfer_params", {"do_remote_decode": True}, None),  # a P/D connector's: none here (as chat's)
])
@pytest.mark.parametrize("stream", [False, True])
def test_vllms_responses_extras_this_server_cannot_serve_are_a_400_naming_them(client, server, field, value, off,
                                                                                stream):
    # They were undeclared: logged and ignored, a 200 answering a different request than the one sent.
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", max_output_tokens=2, stream=stream, extra_body={field: value})
    assert err.value.body["param"] == field and field in err.value.body["message"]
    assert server.metric("vllm:kv_cache_usage_perc") == 0
    served = client.responses.create(model="tiny", input="x", max_output_tokens=2, extra_body={field: off})
    assert served.usage.output_tokens == 2  # their off values are accepted (clients send defaults)


def test_enable_response_messages_returns_the_raw_prompt_and_output_as_vllm(client, server):
    # vLLM's extra: the rendered prompt and the output as generated, each one raw_message_tokens entry (text and ids).
    rendered = httpx.post(f"{server.url}/tokenize", headers=HEADERS, timeout=60,
                          json={"model": "tiny", "messages": [{"role": "user", "content": QUESTION}]}).json()
    ask = {"model": "tiny", "input": QUESTION, "max_output_tokens": 6, "temperature": 0,
           "extra_body": {"enable_response_messages": True}}
    reply = client.responses.create(**ask)
    streamed = list(client.responses.create(**ask, stream=True))[-1].response
    for response in (reply, streamed, client.responses.retrieve(reply.id)):
        body = response.to_dict()
        [prompt], [output] = body["input_messages"], body["output_messages"]
        assert prompt["type"] == output["type"] == "raw_message_tokens"
        assert prompt["tokens"] == rendered["tokens"] and len(prompt["tokens"]) == response.usage.input_tokens
        assert "<|im_start|>user" in prompt["message"] and QUESTION in prompt["message"]
        assert output["message"] == reply.output_text and len(output["tokens"]) == response.usage.output_tokens == 6
    assert streamed.to_dict()["output_messages"] == reply.to_dict()["output_messages"]
    assert "input_messages" not in client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2).to_dict()

"""The engine core in its own process (`flotilla serve`'s default): outputs rebuilt from per-step deltas
equal the engine's own, abort frees the request, named calls run in the core, errors keep their type
and fields across the process boundary, and a dead core fails every waiter and reports its death."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from flotilla.engine.config import EngineConfig
from flotilla.engine.engine_call import EngineCall
from flotilla.engine.engine_core import EngineFactory
from flotilla.engine.engine_core_client import EngineCoreClient
from flotilla.engine.errors import EngineDeadError, InvalidParamError, RequestFailedError
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.output_delta import OutputDecoder, OutputEncoder, core_params
from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
PROMPT = "Once upon a time"


def _output(texts: list[str], tokens: list[list[int]], finished: bool = False, logprobs: bool = False) -> RequestOutput:
    completions = [
        CompletionOutput(index=i, text=t, token_ids=list(ids), finish_reason="stop" if finished else None,
                         cumulative_logprob=-0.5 * len(ids) if logprobs else None,
                         logprobs=[{tok: (-0.5, 1)} for tok in ids] if logprobs else None)
        for i, (t, ids) in enumerate(zip(texts, tokens, strict=True))
    ]
    return RequestOutput("r", "a prompt", [5, 6, 7], [None, {6: (-1.0, 1)}, {7: (-2.0, 1)}], completions, finished)


def test_deltas_rebuild_every_cumulative_output_and_earlier_ones_stay_unchanged():
    # Two completions, logprobs on; the core sends each step's news (delta outputs).
    deltas = [
        _output(["He", ""], [[1], []], logprobs=True),
        _output(["llo", "Hi"], [[2], [3]], logprobs=True),
        _output(["", " there"], [[4], [8]], logprobs=True),
        _output(["!", ""], [[9], []], finished=True, logprobs=True),
    ]
    cumulative = [
        _output(["He", ""], [[1], []], logprobs=True),
        _output(["Hello", "Hi"], [[1, 2], [3]], logprobs=True),
        _output(["Hello", "Hi there"], [[1, 2, 4], [3, 8]], logprobs=True),
        _output(["Hello!", "Hi there"], [[1, 2, 4, 9], [3, 8]], finished=True, logprobs=True),
    ]
    encoder, rebuilt, passed = OutputEncoder(), OutputDecoder(cumulative=True), OutputDecoder()
    decoded, messages = [], []
    for step in deltas:
        message = pickle.loads(pickle.dumps(encoder.encode(step)))
        messages.append(message)
        decoded.append(rebuilt.decode(message))
        assert passed.decode(message) == step  # a delta request's output is the core's delta
    for got, want, delta in zip(decoded, cumulative, deltas, strict=True):
        assert [(c.text, c.token_ids, c.logprobs) for c in got.outputs] == [
            (c.text, c.token_ids, c.logprobs) for c in want.outputs]  # as they were: later steps did not mutate them
        # the engine's cumulative logprob, as sent
        assert [c.cumulative_logprob for c in got.outputs] == [c.cumulative_logprob for c in delta.outputs]
        assert got.prompt_logprobs == want.prompt_logprobs and got.finished == want.finished
    assert len(encoder) == 0  # finished: the core keeps nothing of it
    assert messages[0][2] is not None and all(m[2] is None for m in messages[1:])  # the prompt travels once
    assert messages[1][3][0][:2] == ("llo", [2])  # only the news
    encoder.encode(deltas[0])
    encoder.forget("r")
    assert len(encoder) == 0


def test_the_core_is_asked_for_deltas_in_place_of_cumulative_outputs():
    assert core_params(GREEDY).output_kind == "delta" and GREEDY.output_kind == "cumulative"
    final = GREEDY.model_copy(update={"output_kind": "final_only"})
    assert core_params(final) is final


def test_errors_keep_their_type_and_fields_across_the_process_boundary():
    invalid = pickle.loads(pickle.dumps(InvalidParamError("too long", "max_tokens")))
    assert isinstance(invalid, InvalidParamError) and invalid.param == "max_tokens" and str(invalid) == "too long"
    original = RequestFailedError("req-1", RuntimeError("injected fault"))
    failed = pickle.loads(pickle.dumps(original))
    assert isinstance(failed, RequestFailedError) and failed.request_id == "req-1"
    assert str(failed) == str(original) and "injected fault" in str(failed)


def test_engine_calls_are_named_and_checked():
    assert pickle.loads(pickle.dumps(EngineCall("remove_lora", (3,)))) == EngineCall("remove_lora", (3,))
    with pytest.raises(ValueError, match="not an engine call"):
        EngineCall("shutdown")


@pytest.fixture(scope="module")
def core(tiny_model_dirs):
    """A core process serving the tiny Llama, its stats snapshots, and the in-process engine's greedy tokens."""
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64)
    snapshots = []
    deaths: list[BaseException] = []
    died = threading.Event()

    def on_dead(exc: BaseException) -> None:
        deaths.append(exc)
        died.set()

    client = EngineCoreClient.build(EngineFactory(config), snapshots.append, on_dead)
    reference = LLMEngine(config)
    # Not "Hello there": the tiny model's logits tie (1e-6 apart) at its 5th token, which a batch of 3 may flip.
    reference.add_request(PROMPT, GREEDY, "ref")
    expected = None
    while reference.has_unfinished_requests():
        for output in reference.step():
            expected = output
    yield client, snapshots, expected, (deaths, died)
    client.shutdown()


async def _final(client: EngineCoreClient, request_id: str, prompt: str | list[int] = PROMPT) -> RequestOutput:
    final = None
    async for output in client.generate(prompt, GREEDY, request_id):
        final = output
    assert final is not None and final.finished
    return final


def test_the_core_process_serves_what_the_engine_computes(core):
    client, snapshots, expected, _ = core
    assert snapshots and snapshots[0].num_gpu_blocks > 0  # the first snapshot arrives before serving

    async def run() -> list[RequestOutput]:
        return await asyncio.gather(*(_final(client, f"r{i}") for i in range(3)))

    for output in asyncio.run(run()):
        assert output.outputs[0].token_ids == expected.outputs[0].token_ids
        assert output.outputs[0].text == expected.outputs[0].text
        assert output.prompt_token_ids == expected.prompt_token_ids
    assert client.num_unfinished == 0
    deadline = time.monotonic() + 60  # the step's snapshot follows its outputs
    while snapshots[-1].generation_tokens < 3 * GREEDY.max_tokens and time.monotonic() < deadline:
        time.sleep(0.1)
    assert snapshots[-1].generation_tokens >= 3 * GREEDY.max_tokens


def test_bad_requests_and_calls_fail_alone_with_their_own_errors(core):
    client, *_ = core

    async def run() -> None:
        with pytest.raises(InvalidParamError) as bad:
            await _final(client, "bad", [10**9])
        assert bad.value.param == "prompt"
        with pytest.raises(InvalidParamError, match="LoRA adapters are not enabled"):
            await client.call(EngineCall("add_lora", (LoRARequest("a", 1, "/nowhere"),)))
        assert await client.call(EngineCall("remove_lora", (1,))) is None

    asyncio.run(run())
    assert client.num_unfinished == 0 and client.is_alive


def test_closing_a_stream_aborts_its_request_in_the_core(core):
    client, snapshots, *_ = core
    long = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)

    async def run() -> None:
        stream = client.generate("Hello there", long, "left")
        await anext(stream)
        await stream.aclose()  # the client went away
        assert client.num_unfinished == 0
        await _final(client, "after")  # served; the aborted one no longer runs

    asyncio.run(run())
    deadline = time.monotonic() + 60  # the core reports every half second when idle
    while snapshots[-1].kv_cache_usage != 0.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert snapshots[-1].num_running == 0 and snapshots[-1].kv_cache_usage == 0.0


def test_a_dead_core_fails_every_waiter_and_reports_its_death(core):
    client, _, _, (deaths, died) = core
    long = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)

    async def run() -> None:
        stream = client.generate("Hello there", long, "doomed")
        await anext(stream)
        client._process.kill()  # a crash the core cannot report itself
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    asyncio.run(run())
    assert died.wait(10) and deaths
    assert not client.is_alive

    async def refused() -> None:
        with pytest.raises(EngineDeadError):
            await _final(client, "late")

    asyncio.run(refused())


class _SlowPipe:
    """A pipe end whose first write blocks until released, as a full pipe with a reader that lags."""

    def __init__(self) -> None:
        self.writes: list[list[tuple]] = []
        self.release = threading.Event()

    def send(self, batch: list[tuple]) -> None:
        if not self.writes:
            self.release.wait(5)
        self.writes.append(batch)


@pytest.mark.parametrize("threaded", ["1", "0"])
def test_output_sender_never_blocks_the_loop_and_keeps_order(monkeypatch, threaded):
    from flotilla.engine.core_output_sender import THREAD_ENV, OutputSender

    monkeypatch.setenv(THREAD_ENV, threaded)
    pipe = _SlowPipe()
    if threaded == "0":  # the step loop writes itself: one-message lists (released at once here)
        pipe.release.set()
    sender = OutputSender(pipe)  # type: ignore[arg-type]
    for i in range(5):
        sender.send(("step", i))
    if threaded == "1":
        assert pipe.writes == []  # every send returned while the first write was still blocked
    pipe.release.set()
    sender.close()
    assert [m for batch in pipe.writes for m in batch] == [("step", i) for i in range(5)]
    # Threaded: what queued behind the blocked write went in one write.
    assert len(pipe.writes) <= 2 if threaded == "1" else len(pipe.writes) == 5

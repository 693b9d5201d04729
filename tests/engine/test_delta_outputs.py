"""Delta outputs (`SamplingParams.output_kind="delta"`, vLLM's DELTA): each step's news only, which joined give the
cumulative outputs exactly, and a step's work that does not grow with the length of the output so far."""

from __future__ import annotations

import asyncio
import json
import pickle
import shutil
import statistics
import tracemalloc

import pytest

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.output_delta import OutputDecoder, OutputEncoder
from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.request_stream import RequestStream, joined
from flotilla.engine.sampling_params import SamplingParams

PROMPT = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]
LONG = 600  # output tokens of the long generation


@pytest.fixture(scope="module")
def long_model_dir(tiny_model_dirs, tmp_path_factory):
    """The tiny Llama with room for long outputs (its positions raised past the fixture's 512)."""
    path = tmp_path_factory.mktemp("long") / "llama"
    shutil.copytree(tiny_model_dirs["llama"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return path


def _run(engine: LLMEngine, requests: dict[str, SamplingParams]) -> dict[str, list[RequestOutput]]:
    for request_id, params in requests.items():
        engine.add_request(PROMPT, params, request_id)
    outputs: dict[str, list[RequestOutput]] = {request_id: [] for request_id in requests}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


@pytest.mark.parametrize("include_stop", [False, True])
def test_joined_deltas_are_the_cumulative_outputs_at_every_step(tiny_model_dirs, include_stop):
    """n=2 seeded completions with logprobs and a stop string that one of them meets: each step's delta output,
    joined to the ones before, is that step's cumulative output (text held back for the stop string included)."""
    engine = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=256)
    base = SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=40, ignore_eos=True, logprobs=2)
    free = _run(engine, {"free": base.model_copy(update={"output_kind": "final_only"})})["free"][-1]
    text = free.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # met mid-way by completion 0
    params = base.model_copy(update={"stop": [stop, "never in the text"], "include_stop_str_in_output": include_stop})
    # One after the other: each alone in its steps, so that their logprobs agree to the last bit.
    runs = {**_run(engine, {"cumulative": params}),
            **_run(engine, {"delta": params.model_copy(update={"output_kind": "delta"})})}
    assert len(runs["delta"]) == len(runs["cumulative"]) > 1
    assert runs["cumulative"][-1].outputs[0].stop_reason == stop
    so_far = None
    for delta, cumulative in zip(runs["delta"], runs["cumulative"], strict=True):
        assert all(len(c.token_ids) <= 1 for c in delta.outputs)  # news only: one token a step
        so_far = delta if so_far is None else joined(so_far, delta)
        assert so_far.outputs == cumulative.outputs and so_far.finished == cumulative.finished
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_stream_joins_the_deltas_its_reader_has_not_taken():
    async def run() -> tuple[RequestOutput, RequestOutput]:
        deltas = [_delta("He", [1], False), _delta("llo", [2], False), _delta("!", [3], True)]
        stream = RequestStream(asyncio.get_running_loop(), delta=True)
        stream.put(deltas[0])
        first = await stream.next()
        stream.put(deltas[1])
        stream.put(deltas[2])  # two steps before the reader comes back: one output with both
        return first, await stream.next()

    first, rest = asyncio.run(run())
    assert (first.outputs[0].text, first.outputs[0].token_ids) == ("He", [1])
    assert (rest.outputs[0].text, rest.outputs[0].token_ids, rest.finished) == ("llo!", [2, 3], True)
    assert rest.outputs[0].logprobs == [{2: (-0.5, 1)}, {3: (-0.5, 1)}]


def _delta(text: str, ids: list[int], finished: bool) -> RequestOutput:
    completion = CompletionOutput(0, text, ids, "stop" if finished else None, None, -1.0,
                                  [{t: (-0.5, 1)} for t in ids])
    return RequestOutput("r", "p", [5], None, [completion], finished)


def _step_allocations(engine: LLMEngine, at: list[int], through_the_wire: bool) -> dict[int, float]:
    """Median bytes allocated at the peak of a step (Python's allocations, above what it held before), over the
    20 steps from each output length in `at`; the step as the core serves it (`through_the_wire`: encoded, pickled,
    decoded as the API process does) or as LLMEngine.step alone."""
    encoder, decoder = OutputEncoder(), OutputDecoder()
    peaks: dict[int, list[int]] = {n: [] for n in at}
    request = next(iter(engine.scheduler.requests.values()))
    while engine.has_unfinished_requests():
        window = next((n for n in at if n <= request.num_output_tokens < n + 20), None)
        if window is not None:  # traced from the step's start: its peak is what the step allocated
            tracemalloc.start()
        try:
            for output in engine.step():
                if through_the_wire:
                    decoder.decode(pickle.loads(pickle.dumps(encoder.encode(output))))
            if window is not None:
                peaks[window].append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return {n: statistics.median(p) for n, p in peaks.items()}


def test_a_delta_step_allocates_as_much_late_in_a_long_output_as_early(long_model_dir):
    """The observable: what a step allocates (tracemalloc, not the clock). With cumulative outputs each step copies
    the whole output (token ids, logprobs, text): its allocations grow with the output's length, by thousands of
    bytes between an early and a late step. Delta outputs, with a stop string searched and logprobs on, allocate
    about the same at both."""
    engine = LLMEngine.from_kwargs(str(long_model_dir), max_model_len=LONG + 64, async_scheduling=True)
    params = SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True, logprobs=1, stop=["never in the text"])
    at = [40, LONG - 60]
    engine.add_request(PROMPT, params.model_copy(update={"output_kind": "delta"}), "delta")
    delta = _step_allocations(engine, at, through_the_wire=True)
    engine.add_request(PROMPT, params, "cumulative")
    cumulative = _step_allocations(engine, at, through_the_wire=False)
    grown = LONG - 100  # tokens between the two windows: a copy of the token ids alone is 8 bytes each
    assert cumulative[at[1]] - cumulative[at[0]] > 2 * 8 * grown, cumulative  # the observable sees O(length)
    assert delta[at[1]] - delta[at[0]] < 8 * grown / 4, delta

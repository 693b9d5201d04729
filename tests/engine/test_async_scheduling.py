"""Asynchronous scheduling (the next step planned and launched while the previous one is in flight)
gives exactly the outputs of one-step-at-a-time scheduling, for every way a request can end."""

from __future__ import annotations

import random

import pytest

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams

MAX_LEN = 96


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return str(tiny_model_dirs["llama"])


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def _engine(model: str, async_scheduling: bool, **kwargs) -> LLMEngine:
    return LLMEngine.from_kwargs(
        model, max_model_len=MAX_LEN, block_size=8, async_scheduling=async_scheduling, **kwargs
    )


def _run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], abort_at: dict[int, int] | None = None):
    """Add every request, step to the end (aborting request i at step abort_at[i]); final outputs by
    request, in order, and how many steps fed an input the host did not know yet."""
    ids = [engine.add_request(p, params).request_id for p, params in requests]
    runner, pending_fills = engine.runner, []
    fill = runner._fill_pending

    def counting(input_ids, flat):
        pending_fills.append(len(flat.pending))
        fill(input_ids, flat)

    runner._fill_pending = counting
    finals: dict[str, RequestOutput] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for i, at in (abort_at or {}).items():
            if steps == at:
                engine.abort([ids[i]])
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        steps += 1
    manager = engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "a block leaked"
    assert not engine.scheduler.requests
    return [finals.get(i) for i in ids], sum(1 for n in pending_fills if n)


def _summary(out: RequestOutput | None):
    if out is None:
        return None
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]


def _requests(model: str) -> list[tuple[list[int], SamplingParams]]:
    """Requests ending every way: by length, EOS-like stop tokens and stop strings picked from a
    reference run (so they really fire mid-generation), the context limit; n > 1, seeds, logprobs."""
    rng = random.Random(0)
    prompts = [_prompt(rng, rng.randint(4, 40)) for _ in range(9)]
    greedy = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    reference, _ = _run(_engine(model, False), [(p, greedy) for p in prompts[:2]])
    stop_token = reference[0].outputs[0].token_ids[5]
    stop_text = reference[1].outputs[0].text[6:9]
    return [
        (prompts[0], SamplingParams(temperature=0.0, max_tokens=14, stop_token_ids=[stop_token])),
        (prompts[1], SamplingParams(temperature=0.0, max_tokens=14, stop=[stop_text])),
        (prompts[2], greedy),
        (prompts[3], SamplingParams(temperature=0.0, max_tokens=1)),
        (prompts[4], SamplingParams(temperature=0.9, top_p=0.9, seed=7, n=3, max_tokens=9, ignore_eos=True)),
        (prompts[5], SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)),
        (prompts[6], SamplingParams(temperature=0.0, max_tokens=10, min_tokens=6, stop_token_ids=[stop_token])),
        (_prompt(rng, MAX_LEN - 5), SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)),
        (prompts[7], SamplingParams(temperature=0.7, seed=3, max_tokens=11, ignore_eos=True)),
    ]


def test_every_ending_gives_the_synchronous_outputs(model):
    requests = _requests(model)
    sync, sync_pending = _run(_engine(model, False), requests)
    overlapped, pending = _run(_engine(model, True), requests)
    assert [_summary(o) for o in overlapped] == [_summary(o) for o in sync]
    assert [o.outputs[0].finish_reason for o in sync[:2]] == ["stop", "stop"]  # the stops really fired
    assert sync[7].outputs[0].finish_reason == "length" and len(sync[7].outputs[0].token_ids) == 5
    assert sync_pending == 0 and pending > 0  # async steps fed tokens still on the device
    for a, b in zip(overlapped[5].outputs[0].logprobs, sync[5].outputs[0].logprobs, strict=True):
        assert a.keys() == b.keys()
        assert all(abs(a[t][0] - b[t][0]) < 1e-4 and a[t][1] == b[t][1] for t in a)


def test_penalties_and_chunked_prefill_under_a_tight_pool(model):
    rng = random.Random(1)
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, presence_penalty=0.5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    requests = [(_prompt(rng, rng.randint(10, 50)), params[i % 2]) for i in range(8)]
    kwargs = {"num_gpu_blocks_override": 20, "enable_chunked_prefill": True, "max_num_batched_tokens": 24}
    sync, _ = _run(_engine(model, False, **kwargs), requests)
    engine = _engine(model, True, **kwargs)
    overlapped, _ = _run(engine, requests)
    assert [_summary(o) for o in overlapped] == [_summary(o) for o in sync]
    assert engine.scheduler.num_preemptions > 0


def test_aborts_while_a_step_is_in_flight_free_everything(model):
    rng = random.Random(2)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    requests = [(_prompt(rng, 20), greedy) for _ in range(4)]
    aborts = {0: 1, 2: 4}  # one right after its prefill launched, one mid-decode
    sync, _ = _run(_engine(model, False), requests)
    overlapped, _ = _run(_engine(model, True), requests, abort_at=aborts)
    assert overlapped[0] is None or overlapped[0].outputs[0].finish_reason == "abort"
    assert [_summary(overlapped[i]) for i in (1, 3)] == [_summary(sync[i]) for i in (1, 3)]


def test_abort_while_a_prompt_logprobs_step_is_in_flight(model):
    """A client that goes away while its prompt (with prompt_logprobs) is being prefilled: the step in
    flight still brings that request's prompt logprobs back, for a request the engine no longer knows;
    the engine drops them and keeps serving (it used to die of a KeyError, and the server with it)."""
    rng = random.Random(3)
    engine = _engine(model, True)
    gone = engine.add_request(_prompt(rng, 20), SamplingParams(max_tokens=4, prompt_logprobs=2))
    engine.step()  # its prefill launched, not yet collected
    engine.abort([gone.request_id])
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=1)
    outputs, _ = _run(engine, [(_prompt(rng, 12), greedy)])
    assert len(outputs[0].outputs[0].token_ids) == 4 and len(outputs[0].prompt_logprobs) == 12


def test_a_leader_preempted_while_its_prompt_step_is_in_flight_forks_no_blockless_completions(model):
    """n=2: planning the next step preempts the request whose prompt step is still in flight (the pool
    is dry), and that step then forks its second completion. The completion must not start from the
    leader's blocks, which the preemption has freed (it got none, and computed on K/V never written);
    both completions give the tokens of an unpressed run."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    requests = [
        (list(range(100, 115)), SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)),  # blocks 0, 1
        (list(range(200, 207)), greedy),  # block 2; its second decode takes the first block freed
        (list(range(300, 316)), SamplingParams(n=2, temperature=0.0, max_tokens=8, ignore_eos=True)),  # 3, 4
    ]
    reference, _ = _run(LLMEngine.from_kwargs(model, max_model_len=32, block_size=8), requests)
    engine = LLMEngine.from_kwargs(model, max_model_len=32, block_size=8, async_scheduling=True,
                                   num_gpu_blocks_override=5)
    pressed, _ = _run(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    assert [_summary(o) for o in pressed] == [_summary(o) for o in reference]


def test_a_structured_output_request_beside_one_with_penalties(model):
    """A running request with penalties makes each step wait for the previous one's tokens
    (`_step_after_known_outputs`); a structured-output request's draw waits for its grammar's bitmask, and that
    path launched the step without ever drawing it: the next collect had no token for it (KeyError: the engine
    loop died). Both requests are ordinary: JSON mode plus a frequency_penalty elsewhere on the server."""
    from flotilla.engine.structured_output.params import StructuredOutputsParams

    prompt = [101, 2034, 887, 41]
    constrained = SamplingParams(temperature=0.0, max_tokens=20,
                                 structured_outputs=StructuredOutputsParams(regex=r"(cat|dog|eel){1,3}!"))
    penalised = SamplingParams(temperature=0.0, max_tokens=12, frequency_penalty=0.5, ignore_eos=True)
    requests = [(prompt, constrained), (prompt, penalised)]
    sync, _ = _run(_engine(model, False), requests)
    overlapped, _ = _run(_engine(model, True), requests)
    assert [_summary(o) for o in overlapped] == [_summary(o) for o in sync]
    text = sync[0].outputs[0].text
    assert text.endswith("!") and text[:-1].replace("cat", "").replace("dog", "").replace("eel", "") == ""

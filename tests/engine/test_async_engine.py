"""The step loop survives one request's failure: that request gets the error, its KV blocks return to
the pool, and every other request is served (a fault is injected with a test-only monkeypatch)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.errors import RequestFailedError
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


async def _collect(engine: AsyncEngine, request_id: str, prompt: str = "Hello there") -> list[int]:
    final = None
    async for output in engine.generate(prompt, PARAMS, request_id):
        final = output
    return final.outputs[0].token_ids


@pytest.fixture
def build(tiny_model_dirs):
    engines = []

    def start() -> AsyncEngine:
        engine = AsyncEngine.build(lambda: LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64))
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.shutdown()


def _assert_all_blocks_free(engine: AsyncEngine) -> None:
    manager = engine.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert not engine.engine.has_unfinished_requests()


def _assert_only_the_victim_fails(engine: AsyncEngine, victim_prompt: str, fault: str) -> None:
    """Request "victim" (`victim_prompt`) and "bystander" at once: the victim fails with the injected `fault`,
    the bystander gets all its tokens, and the loop lives on with every block back in the pool."""

    async def run() -> list:
        return await asyncio.gather(_collect(engine, "victim", victim_prompt), _collect(engine, "bystander"),
                                    return_exceptions=True)

    victim, bystander = asyncio.run(run())
    assert isinstance(victim, RequestFailedError) and fault in str(victim)
    assert len(bystander) == 8
    assert engine.is_alive
    _assert_all_blocks_free(engine)


def test_a_failure_while_processing_one_request_fails_that_request_only(build, monkeypatch):
    original = LLMEngine._process_token

    def faulty(self, child, result):
        if child.parent_id == "victim" and child.num_output_tokens >= 3:
            raise RuntimeError("injected fault")
        return original(self, child, result)

    monkeypatch.setattr(LLMEngine, "_process_token", faulty)
    engine = build()
    _assert_only_the_victim_fails(engine, "Hello there", "injected fault")
    assert len(asyncio.run(_collect(engine, "after"))) == 8


def test_a_failure_while_adding_one_request_fails_that_request_only(build, monkeypatch):
    engine = build()
    original = engine.engine.tokenizer.encode

    def faulty(text, *args, **kwargs):
        if "poison" in text:
            raise RuntimeError("injected tokenizer fault")
        return original(text, *args, **kwargs)

    monkeypatch.setattr(engine.engine.tokenizer, "encode", faulty)
    _assert_only_the_victim_fails(engine, "poison", "injected tokenizer fault")


def test_a_loop_failure_calls_on_dead_and_fails_every_waiter(tiny_model_dirs, monkeypatch):
    def broken(self):
        raise RuntimeError("injected device fault")

    monkeypatch.setattr(LLMEngine, "step", broken)
    deaths: list[BaseException] = []
    engine = AsyncEngine.build(lambda: LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64),
                               on_dead=deaths.append)
    try:
        with pytest.raises(Exception, match="the engine loop died"):
            asyncio.run(_collect(engine, "any"))
        assert not engine.is_alive
        deadline = time.monotonic() + 60
        while not deaths and time.monotonic() < deadline:  # on_dead runs after the waiters are failed
            time.sleep(0.05)
        assert [str(d) for d in deaths] == ["injected device fault"]
    finally:
        engine.shutdown()


def test_a_slow_reader_gets_the_latest_output_and_loses_nothing(build):
    """Outputs are handed over once per step and a stream keeps only the newest cumulative one, so a
    reader that falls behind skips intermediate snapshots, never tokens or text."""
    engine = build()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)

    async def run() -> tuple[list, list]:
        slow, fast = [], []

        async def read(request_id: str, sink: list, pause: float) -> None:
            async for output in engine.generate("Hello there", params, request_id):
                sink.append(output)
                await asyncio.sleep(pause)  # blocks nothing: the engine keeps stepping meanwhile

        await asyncio.gather(read("slow", slow, 0.3), read("fast", fast, 0))
        return slow, fast

    slow, fast = asyncio.run(run())
    assert slow[-1].finished and fast[-1].finished
    assert slow[-1].outputs[0].token_ids == fast[-1].outputs[0].token_ids
    assert len(slow[-1].outputs[0].token_ids) == 24
    assert slow[-1].outputs[0].text == fast[-1].outputs[0].text
    assert len(slow) < len(fast)  # the slow reader saw fewer, larger snapshots
    for earlier, later in itertools.pairwise(slow):  # each snapshot extends the one before
        assert later.outputs[0].token_ids[: len(earlier.outputs[0].token_ids)] == earlier.outputs[0].token_ids
    _assert_all_blocks_free(engine)

"""The `ServingEngine` contract (engine/serving_engine.py), held alike by both front ends: `AsyncEngine`
(the step loop on a thread of this process) and `EngineCoreClient` (the step loop in a core process)."""

from __future__ import annotations

import asyncio
import time

import pytest

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.config import EngineConfig
from flotilla.engine.engine_core import EngineFactory
from flotilla.engine.engine_core_client import EngineCoreClient
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.stats import StatsSnapshot

SHORT = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=[AsyncEngine, EngineCoreClient], ids=["thread", "process"])
def serving(request: pytest.FixtureRequest, tiny_model_dirs):
    """A front end serving the tiny Llama, and the stats snapshots it reports."""
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64)
    snapshots: list[StatsSnapshot] = []
    engine = request.param.build(EngineFactory(config), snapshots.append)
    yield engine, snapshots
    engine.shutdown()


def _wait_until_idle(snapshots: list[StatsSnapshot]) -> None:
    """Both front ends report every half second when idle: wait for a report with nothing running."""
    deadline = time.monotonic() + 60
    while (snapshots[-1].num_running or snapshots[-1].kv_cache_usage) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_request_that_reuses_a_live_requests_id_is_refused_and_the_live_one_runs_on(serving):
    """A second request under a live request's id is refused; that refusal must not end the live one (the
    thread's refused stream aborted the id in its clean-up; the process client kept one stream per id:
    either way the live request's outputs were dropped and its reader hung)."""
    engine, snapshots = serving

    async def run() -> RequestOutput:
        live = engine.generate("Hello there", LONG, "same")
        final = await anext(live)  # it runs
        with pytest.raises(ValueError, match="duplicate request id"):
            async for _ in engine.generate("Hello there", SHORT, "same"):
                pass
        async for output in live:  # within the deadline: its outputs still reach it
            final = output
        return final

    final = asyncio.run(asyncio.wait_for(run(), 20))
    assert final.finished and len(final.outputs[0].token_ids) == LONG.max_tokens
    assert engine.num_unfinished == 0
    _wait_until_idle(snapshots)
    assert snapshots[-1].num_running == 0 and snapshots[-1].kv_cache_usage == 0.0  # every block returned

"""Grammars compile off the step loop: a request waits for its grammar (no KV blocks, not scheduled) while
the others decode; an abort while it compiles leaves nothing behind; a compile past the bound fails that
request alone (a 400 for the server) and its constraint is refused at once from then on; an invalid
constraint is still refused when the request is added. Real engine on the tiny Llama, both schedulers."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from flotilla.engine.errors import EngineBusyError, InvalidParamError, client_error
from flotilla.engine.llm import LLM
from flotilla.engine.request import RequestStatus
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.structured_output.params import StructuredOutputsParams

xgr = pytest.importorskip("xgrammar")

from flotilla.engine.structured_output.compile_process import CompileProcess  # noqa: E402  # needs xgrammar

_fresh = itertools.count()


def slow_schema(n: int) -> dict:
    """A legal schema that takes seconds to compile: `n` string properties with bounded-repetition
    patterns (n=60: 2-4 s, n=100: 4-8 s on the 49k-token tokenizer of the tiny models, one core)."""
    props = {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1},{i % 7 + 40}}}-[0-9]{{2,30}}(x|y|z){{1,20}}$"}
             for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def fresh_choice() -> StructuredOutputsParams:
    """A constraint no earlier test compiled (so it is not in the cache)."""
    k = next(_fresh)
    return StructuredOutputsParams(choice=[f"alpha{k}", f"beta{k}"])


def constrained(spec: StructuredOutputsParams, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=20, temperature=1.0, seed=3, n=n, structured_outputs=spec)


FREE = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async-scheduling"])
def llm(request, tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), device="cpu", max_model_len=256, block_size=8,
               async_scheduling=request.param)


class Gate:
    """Holds every compile sent to a compile process until `open()` (then the process compiles it);
    `entered` is set once one waits. Installed with `install`."""

    def __init__(self) -> None:
        self.compile = CompileProcess.compile
        self.opened = threading.Event()
        self.entered = threading.Event()

    def __call__(self, process, *args):
        self.entered.set()
        assert self.opened.wait(60), "the test never opened the gate"
        return self.compile(process, *args)

    def install(self, monkeypatch) -> Gate:
        monkeypatch.setattr(CompileProcess, "compile", lambda process, *args: self(process, *args))
        return self

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def gate(llm, monkeypatch):
    g = Gate().install(monkeypatch)
    yield g
    g.open()
    _drain(llm.engine)


def _drain(engine, limit: float = 60.0):
    """Step until no request is left and no compile pends; returns the finished outputs by id."""
    finals = {}
    deadline = time.monotonic() + limit
    while engine.has_unfinished_requests() or engine.grammar_compiles.num_pending:
        assert time.monotonic() < deadline, "the engine did not finish"
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if not engine.has_unfinished_requests():
            time.sleep(0.01)  # a compile nobody waits for any more finishes on its thread
    return finals


def _assert_nothing_held(engine):
    assert not engine.has_unfinished_requests()
    assert not engine.scheduler.requests and not engine._groups and not engine._detokenizers
    assert not engine._compiling
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.block_manager._hashes  # a prompt's block hashes, computed when it was added, are dropped
    assert engine.stats_snapshot().num_waiting == 0


def test_requests_decode_while_a_grammar_compiles(llm, gate):
    engine = llm.engine
    spec = fresh_choice()
    free = engine.add_request("Hello there", FREE)
    slow = engine.add_request("Pick:", constrained(spec))
    assert gate.entered.wait(30)
    while not free.status.finished:
        engine.step()
    # The free request ran to the end while the grammar was still compiling; the constrained one was
    # never scheduled and holds no KV block, but counts as waiting.
    assert free.num_output_tokens == 12
    assert slow.status == RequestStatus.WAITING and slow.num_output_tokens == 0 and not slow.block_ids
    assert slow.request_id not in engine.scheduler.requests and slow.first_scheduled_time is None
    assert engine.stats_snapshot().num_waiting == 1 and engine.has_unfinished_requests()
    gate.open()
    finals = _drain(engine)
    assert finals[slow.request_id].outputs[0].text in spec.choice
    _assert_nothing_held(engine)


def test_a_free_request_finishes_while_a_real_slow_schema_compiles(llm, monkeypatch):
    engine = llm.engine
    monkeypatch.setattr(engine.grammar_compiles, "timeout_s", 600)  # a loaded machine's compile is not killed
    spec = StructuredOutputsParams(json=slow_schema(60 + next(_fresh)))  # a new schema, not cached
    slow = engine.add_request("JSON:", SamplingParams(max_tokens=8, temperature=0, structured_outputs=spec))
    waiting = engine._compiling[slow.request_id].pending
    start = time.monotonic()
    free = engine.add_request("Hello there", FREE)
    while not free.status.finished:
        engine.step()
    # Tokens flowed (all twelve) while xgrammar compiled on its thread: the compile takes seconds, twelve
    # tiny-model steps a small fraction of that; the step loop never waited for it.
    assert free.num_output_tokens == 12
    assert not waiting.future.done(), f"the compile ended within {time.monotonic() - start:.2f} s"
    engine.abort([slow.request_id])  # aborting mid-compile: nobody waits for it, it is killed
    _assert_nothing_held(engine)
    assert engine.grammar_compiles.num_pending == 0
    _drain(engine)


def test_a_running_compile_that_no_request_waits_for_is_killed(llm, monkeypatch):
    # A compile whose requests had all left ran on to the bound (10 s by default) or to its end, and then shipped its
    # grammar back (slow_schema(90): 6.5 s of CPU to compile, 15 s to serialize 155 MB, 5.7 s to read back), burning
    # cores and holding its compile thread from requests that wait. Now it is killed once its last request leaves.
    engine = llm.engine
    queue = engine.grammar_compiles
    monkeypatch.setattr(queue, "timeout_s", 600)  # so that only the abort can end them early
    specs = [StructuredOutputsParams(json=slow_schema(300 + next(_fresh))) for _ in range(queue.workers)]
    slow = [engine.add_request("JSON:", SamplingParams(max_tokens=8, structured_outputs=s)) for s in specs]
    pendings = [engine._compiling[r.request_id].pending for r in slow]
    deadline = time.monotonic() + 120
    while not all(p.started for p in pendings):  # each compile thread has taken one (a wait, not a timing check)
        assert time.monotonic() < deadline, "the compile threads never took the compiles"
        time.sleep(0.01)
    processes = [process._process for process in queue._processes]
    engine.abort([r.request_id for r in slow])
    assert queue.num_pending == 0
    spec = fresh_choice()
    after = engine.add_request("Pick:", constrained(spec))  # before: queued behind the unwanted compiles
    assert _drain(engine, limit=60)[after.request_id].outputs[0].text in spec.choice
    from flotilla.engine.structured_output.compile_process import CompileAbandoned

    assert all(isinstance(p.future.exception(timeout=10), CompileAbandoned) for p in pendings)
    assert not any(process.is_alive() for process in processes)  # killed, fresh ones in their place
    assert all(engine.grammar_compiler.lookup(s.cache_key()) is None for s in specs)
    _assert_nothing_held(engine)


def test_abort_while_compiling_leaves_nothing(llm, gate):
    engine = llm.engine
    spec = fresh_choice()
    before = engine.grammar_compiler.num_compiled
    a = engine.add_request("Pick:", constrained(spec, n=2))
    b = engine.add_request("Pick again:", constrained(spec))  # shares the compile
    assert gate.entered.wait(30)
    assert engine.grammar_compiles.num_pending == 1
    engine.abort([a.request_id])
    engine.step()
    assert b.request_id in engine._compiling and a.request_id not in engine._compiling
    engine.abort([b.request_id])
    _assert_nothing_held(engine)
    assert a.status == b.status == RequestStatus.FINISHED_ABORTED
    assert engine.grammar_compiles.num_pending == 0  # nobody waits for its compile: dropped
    gate.open()
    assert not _drain(engine)  # nothing finishes: both were aborted
    assert engine.grammar_compiler.num_compiled == before  # the compile was dropped unfinished
    # The next request for that constraint compiles it anew.
    c = engine.add_request("Pick:", constrained(spec))
    assert c.request_id in engine._compiling
    assert _drain(engine)[c.request_id].outputs[0].text in spec.choice
    assert engine.grammar_compiler.num_compiled == before + 1


def test_a_compile_past_the_bound_fails_that_request_alone(llm, gate, monkeypatch):
    engine = llm.engine
    monkeypatch.setattr(engine.grammar_compiles, "timeout_s", 0.3)
    spec = fresh_choice()
    slow = engine.add_request("Pick:", constrained(spec))
    free = engine.add_request("Hello there", FREE)
    failures = []
    while not free.status.finished:
        engine.step()
        failures += engine.take_failures()
    while not failures:  # the bound has not passed yet: wait for it
        time.sleep(0.05)
        engine.step()
        failures += engine.take_failures()
    assert [f.request_id for f in failures] == [slow.request_id]
    error = client_error(failures[0])
    assert isinstance(error, InvalidParamError) and error.param == "structured_outputs"
    assert "took longer than 0.3 s to compile" in str(error)
    assert free.num_output_tokens == 12 and free.finish_reason == "length"
    # The same constraint is refused at once while its compile still runs: no second compile is queued.
    with pytest.raises(InvalidParamError, match="took longer than 0.3 s"):
        engine.add_request("Pick:", constrained(spec))
    assert engine.grammar_compiles.num_pending == 0  # nobody waits for that compile any more: dropped
    _assert_nothing_held(engine)
    gate.open()
    _drain(engine)
    assert engine.grammar_compiler.lookup(spec.cache_key()) is None  # killed, not compiled after all


def test_a_compile_past_the_bound_is_killed_and_the_next_grammar_compiles_at_once(llm, monkeypatch):
    # A compile past the bound held its thread until xgrammar returned (slow_schema(300): tens of seconds, ~90 s for
    # the fuzzer's grammars), and with every thread so held each new grammar waited, then got a 503. Now the compile
    # runs in a process that is killed at the bound, and the next compile starts in a fresh one.
    engine = llm.engine
    queue = engine.grammar_compiles
    monkeypatch.setattr(queue, "timeout_s", 1.0)
    slow_specs = [StructuredOutputsParams(json=slow_schema(300 + next(_fresh))) for _ in range(queue.workers)]
    slow = [engine.add_request("JSON:", SamplingParams(max_tokens=8, structured_outputs=spec)) for spec in slow_specs]
    spec = fresh_choice()
    after = engine.add_request("Pick:", constrained(spec))  # queued behind every slow compile
    finals, failures = {}, []
    deadline = time.monotonic() + 120
    while engine.has_unfinished_requests():
        assert time.monotonic() < deadline, "the engine did not finish"
        finals |= {out.request_id: out for out in engine.step() if out.finished}
        failures += engine.take_failures()
        if not engine.has_unfinished_requests() or engine.scheduler.has_unfinished():
            continue
        time.sleep(0.01)
    assert sorted(f.request_id for f in failures) == sorted(r.request_id for r in slow)
    assert all("took longer than 1 s to compile" in str(client_error(f)) for f in failures)
    assert finals[after.request_id].outputs[0].text in spec.choice
    # The slow compiles were killed, not left running: none is pending, none ever reaches the cache, and their
    # constraints stay refused.
    assert queue.num_pending == 0
    assert all(engine.grammar_compiler.lookup(s.cache_key()) is None for s in slow_specs)
    with pytest.raises(InvalidParamError, match="took longer than 1 s"):
        engine.add_request("JSON:", SamplingParams(max_tokens=8, structured_outputs=slow_specs[0]))
    _assert_nothing_held(engine)


def test_an_invalid_constraint_is_refused_when_added_and_a_late_failure_reaches_the_caller(llm, monkeypatch):
    engine = llm.engine
    with pytest.raises(InvalidParamError, match="regex"):
        engine.add_request("x", constrained(StructuredOutputsParams(regex="(unclosed")))
    assert engine.grammar_compiles.num_pending == 0

    def broken(process, *args):
        raise InvalidParamError("invalid choice constraint for structured output: broken", "structured_outputs")

    monkeypatch.setattr(CompileProcess, "compile", broken)
    with pytest.raises(InvalidParamError, match="broken") as info:
        llm.generate(["Pick:"], constrained(fresh_choice()), use_tqdm=False)
    assert info.value.param == "structured_outputs"
    _assert_nothing_held(engine)


def _queue(engine, monkeypatch, timeout_s: float, max_pending: int = 64):
    """A one-thread compile queue over the engine's compiler, gated."""
    from flotilla.engine.structured_output.compile_queue import GrammarCompiles

    g = Gate().install(monkeypatch)
    return GrammarCompiles(engine.grammar_compiler, timeout_s, workers=1, max_pending=max_pending), g


def test_a_compile_queued_behind_one_past_the_bound_waits_its_turn_and_is_dropped_unwanted(llm, monkeypatch):
    # Until compiles could be killed, a queued compile behind threads held past the bound was a 503 at the bound;
    # now no thread is held much past it (the kill: test_a_compile_past_the_bound_is_killed_...), so it waits.
    queue, g = _queue(llm.engine, monkeypatch, timeout_s=0.2)
    try:
        first = queue.submit(fresh_choice(), "a")
        assert g.entered.wait(60)
        second = queue.submit(fresh_choice(), "b")
        assert queue.num_pending == 2 and second.started is None
        time.sleep(0.25)  # the one thread runs a compile past the bound (held by the gate, outside its process)
        now = time.monotonic()
        assert queue.check(second, "b", now=now) is None
        # The first has run past the bound: refused (400), and so is its constraint from now on.
        assert isinstance(queue.check(first, "a", now=now), InvalidParamError)
        assert queue.num_pending == 1  # its last request failed: the first is dropped (killed in its process)
        queue.forget(second, "b")  # its request went away: a queued compile nobody waits for is dropped
        assert second.future.cancelled() and queue.num_pending == 0
    finally:
        g.open()
        queue.shutdown()


def test_the_offline_llm_queues_every_compile_of_its_batch(llm):
    """The server's engine caps pending compiles (MAX_PENDING, a 503 past it); an offline batch of more
    distinct schemas than that is the caller's own work and is served whole."""
    from flotilla.engine.structured_output.compile_queue import MAX_PENDING

    assert llm.engine.grammar_compiles.max_pending is None
    specs = [fresh_choice() for _ in range(MAX_PENDING + 2)]
    outs = llm.generate(["Pick:"] * len(specs), [constrained(s) for s in specs], use_tqdm=False)
    assert all(o.outputs[0].text in s.choice for o, s in zip(outs, specs, strict=True))


def test_pending_compiles_are_capped(llm, monkeypatch):
    queue, g = _queue(llm.engine, monkeypatch, timeout_s=60, max_pending=2)
    try:
        shared = fresh_choice()
        queue.submit(shared, "a")
        queue.submit(fresh_choice(), "b")
        assert queue.submit(shared, "c") is queue.submit(shared, "d")  # joining a pending compile is free
        with pytest.raises(EngineBusyError, match="2 structured-output grammars are compiling"):
            queue.submit(fresh_choice(), "e")
    finally:
        g.open()
        queue.shutdown()


@pytest.mark.parametrize("value", ['{"compile_timeout_s": 0}', '{"compile_timeout_s": -1}',
                                   '{"compile_timeout_s": "soon"}'])
def test_compile_timeout_must_be_a_positive_number(value):
    from flotilla.engine.structured_output.config import parse_structured_outputs_config

    assert parse_structured_outputs_config('{"compile_timeout_s": 2.5}').compile_timeout_s == 2.5
    assert parse_structured_outputs_config(None).compile_timeout_s == 10
    with pytest.raises(ValueError, match="compile_timeout_s"):
        parse_structured_outputs_config(value)


def test_the_async_engine_hands_late_refusals_to_the_caller_as_themselves(tiny_model_dirs, monkeypatch):
    """Through the server's in-process step loop: a compile past the bound reaches `generate`'s caller as
    the InvalidParamError (a 400), a full compile queue as EngineBusyError (a 503), not as a failure (500)."""
    import asyncio

    from flotilla.engine.async_engine import AsyncEngine
    from flotilla.engine.llm_engine import LLMEngine

    release = threading.Event()
    original = CompileProcess.compile

    def slow(process, *args):
        # Held until the refusal was seen: past the 0.2 s bound however long a loaded machine stalls the step
        # loop (a fixed 1 s compile could end first, and then it was served).
        release.wait(60)
        return original(process, *args)

    monkeypatch.setattr(CompileProcess, "compile", slow)

    def build() -> LLMEngine:
        engine = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64)
        engine.grammar_compiles.timeout_s = 0.2
        return engine

    engine = AsyncEngine.build(build)

    async def first(request_id: str, spec: StructuredOutputsParams):
        async for output in engine.generate("Pick:", constrained(spec), request_id):
            return output

    try:
        with pytest.raises(InvalidParamError, match="took longer than 0.2 s"):
            asyncio.run(first("late", fresh_choice()))
        engine.engine.grammar_compiles.max_pending = 0
        with pytest.raises(EngineBusyError, match="compiling already"):
            asyncio.run(first("busy", fresh_choice()))
        release.set()
        deadline = time.monotonic() + 30
        while engine.engine.grammar_compiles.num_pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.engine.has_unfinished_requests()
    finally:
        release.set()
        engine.shutdown()


def test_several_threads_compile_at_once_into_one_cache(llm):
    """xgrammar's compiler serves several compile threads at once (as vLLM's thread pool uses it); every
    grammar comes out whole and lands in the shared cache."""
    from flotilla.engine.structured_output.compile_queue import GrammarCompiles

    compiler = llm.engine.grammar_compiler
    queue = GrammarCompiles(compiler, timeout_s=60, workers=3)
    try:
        specs = [StructuredOutputsParams(json=slow_schema(6 + next(_fresh) % 10)) for _ in range(4)]
        specs += [fresh_choice() for _ in range(4)]
        pendings = [queue.submit(spec, f"r{i}") for i, spec in enumerate(specs)]
        for spec, pending in zip(specs, pendings, strict=True):
            compiled = pending.future.result(timeout=120)
            assert compiler.lookup(spec.cache_key()) is compiled
            matcher = xgr.GrammarMatcher(compiled)
            if spec.choice is not None:
                assert matcher.accept_string(spec.choice[1])
            else:
                assert matcher.accept_string('{"p0": "ab-12x"')
                assert not xgr.GrammarMatcher(compiled).accept_string('{"p0": 5')
        deadline = time.monotonic() + 60
        while queue.num_pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queue.num_pending == 0
    finally:
        queue.shutdown()


def test_a_schema_key_made_off_the_loop_crosses_the_pipe_and_is_not_made_again(monkeypatch):
    # A schema's cache key (canonical JSON: ~0.9 s for 150,000 properties here) was made at admission on the step
    # loop, and its text made again by json.dumps on a compile thread, holding the GIL. The front end now makes it
    # on a worker thread (ServingEngine.generate); it is pickled with the params to the core, and the compile uses
    # its text. (On the real server, a stream's longest gap while a 5 MB schema came: 1.5 s before, 0.5-1.0 s after
    # on this loaded machine: the rest is the schema's pickling across the pipe; not a test: too noisy here.)
    import asyncio
    import pickle

    from flotilla.engine.structured_output import params as params_module
    from flotilla.engine.structured_output.params import key_made_off_the_loop

    spec = StructuredOutputsParams(json={"type": "object", "properties": {"b": {"type": "string"},
                                                                          "a": {"type": "integer"}}})
    asyncio.run(key_made_off_the_loop(spec))
    copy = pickle.loads(pickle.dumps(spec))
    monkeypatch.setattr(params_module, "_canonical", lambda *_: pytest.fail("the key was made again"))
    assert copy.cache_key() == spec.cache_key()
    text = '{"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "type": "object"}'
    assert copy.cache_key()[1] == text
    monkeypatch.undo()
    fresh = StructuredOutputsParams(json={"type": "object", "properties": {"b": {"type": "string"},
                                                                           "a": {"type": "integer"}}})
    assert fresh.cache_key() == spec.cache_key()


def test_a_dict_schema_crosses_the_core_pipe_as_its_checked_text(llm, monkeypatch):
    # The front end pickled the schema's dict (and its key's text beside it: 10.7 MB for a 7.5 MB schema) to the
    # engine core, whose unpickling held the core's GIL (~0.1 s at that size: every stream stopped; as long again
    # to pickle on the front end), and the core parsed the text once more to look for unenforced keywords (0.15
    # s). Now the front end sends the key's text (7.5 MB, a millisecond each way), checked on its worker thread:
    # the core compiles from the text and never parses it.
    import asyncio
    import json
    import pickle
    from types import SimpleNamespace

    from flotilla.engine.structured_output import compiler as compiler_module
    from flotilla.engine.structured_output.params import ready_off_the_loop

    def crossed(params: SamplingParams) -> SamplingParams:  # what EngineCoreClient.generate sends to the core
        return pickle.loads(pickle.dumps(asyncio.run(ready_off_the_loop(params))))

    name = f"k{next(_fresh)}"
    schema = {"type": "object", "properties": {name: {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": [name]}
    front = constrained(StructuredOutputsParams(json=schema, disable_any_whitespace=True))
    sent = crossed(front)
    assert isinstance(sent.structured_outputs.json_schema, str)
    assert front.structured_outputs.json_schema == schema  # the front end keeps its dict
    assert sent.structured_outputs.cache_key() == StructuredOutputsParams(json=schema,
                                                                          disable_any_whitespace=True).cache_key()
    parse = json.loads
    monkeypatch.setattr(compiler_module, "json", SimpleNamespace(loads=lambda *_: pytest.fail("parsed in the core")))
    out = llm.generate(["Pick:"], sent, use_tqdm=False)[0].outputs[0]
    assert list(parse(out.text)) == [name], out.text
    unenforced = {"type": "integer", "not": {"const": 3}, "description": name}
    with pytest.raises(InvalidParamError, match="not"):  # still refused, by the front end's check
        llm.generate(["Pick:"], crossed(constrained(StructuredOutputsParams(json=unenforced))), use_tqdm=False)

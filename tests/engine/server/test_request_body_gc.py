"""The garbage-collection pause of request_body: large bodies parse with GC off, and overlapping parses never
keep it off past the parse that turned it off (a stream of overlapping large bodies kept it off for good)."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, model_validator

from flotilla.engine.server import request_body

BODY = json.dumps({"name": "", "pad": "x" * request_body.GC_PAUSE_MIN_BYTES}).encode()


class _Gate:
    """A parse that stops in its validator until released, recording whether GC ran at that point."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.gc_enabled_inside: bool | None = None


_gates: dict[str, _Gate] = {}


class Blocking(BaseModel):
    name: str
    pad: str

    @model_validator(mode="after")
    def _wait(self) -> Blocking:
        gate = _gates[threading.current_thread().name]
        gate.gc_enabled_inside = gc.isenabled()
        gate.inside.set()
        assert gate.release.wait(30)
        return self


@pytest.fixture
def gc_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def _start(name: str) -> tuple[_Gate, threading.Thread]:
    gate = _gates[name] = _Gate()
    thread = threading.Thread(target=request_body._parsed, args=(BODY, Blocking), name=name, daemon=True)
    thread.start()
    assert gate.inside.wait(30)
    return gate, thread


def _finish(gate: _Gate, thread: threading.Thread) -> None:
    gate.release.set()
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.usefixtures("gc_on")
def test_a_large_body_parses_with_gc_off_and_turns_it_back_on():
    gate, thread = _start("alone")
    _finish(gate, thread)
    assert gate.gc_enabled_inside is False
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_on")
def test_overlapping_large_bodies_do_not_keep_gc_off():
    # A chain of overlapping parses (a enters, b enters, a ends, c enters, b ends, ...) kept the pause counter above
    # zero, so GC stayed off for as long as large bodies kept coming: cyclic garbage of every request piled up.
    # The parse that turned GC off turns it back on when it ends; the ones that overlapped it run with GC on.
    a = _start("a")
    b = _start("b")
    _finish(*a)
    assert gc.isenabled(), "GC still off after the parse that paused it ended"
    c = _start("c")
    _finish(*b)
    assert gc.isenabled()
    _finish(*c)
    assert gc.isenabled()
    assert a[0].gc_enabled_inside is False

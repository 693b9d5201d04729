"""The engine core's line to its workers: pickled objects over a gloo process group.

The engine process and the `tp x pp` workers form one gloo group of `workers + 1` ranks, the engine
last. Each step the engine broadcasts its scheduler output (a length, then the pickled bytes) and
receives the step's result from the driver worker with a point-to-point recv. torch.distributed
carries every byte; nothing here opens a socket of its own.

A request travels whole once; in later steps only what changed does (new output tokens, block table,
counters), as vLLM's cached-request updates, so a step's message does not grow with the contexts.
Workers keep their copy by request id until the engine reports the request gone.

The group is built straight from a store (`ProcessGroupGloo(store, rank, size)`), not through
`init_process_group`, so the engine process keeps no global torch.distributed state: several engines
(and a worker's own model group) can live side by side.
"""

from __future__ import annotations

import datetime
import io
import pickle
import weakref
from typing import Any

import torch
import torch.distributed as dist

from flotilla.engine.request import Request
from flotilla.engine.scheduler import SchedulerOutput

# Workers wait in a broadcast for the next step for as long as the server is idle: no timeout there.
_IDLE_TIMEOUT = datetime.timedelta(days=365)


class StepChannel:
    """One end of the engine-to-workers channel; `rank` is this process's rank in it."""

    def __init__(self, store: dist.Store, rank: int, num_workers: int) -> None:
        self.rank = rank
        self.engine_rank = num_workers
        # Typed Any: torch's stubs omit the collectives the gloo backend object has (broadcast, send, recv).
        self.group: Any = dist.ProcessGroupGloo(dist.PrefixStore("steps", store), rank, num_workers + 1, _IDLE_TIMEOUT)

        self._sent = _SentRequests()  # the engine's side: what the workers hold
        self._held: dict[str, Request] = {}  # a worker's side: its copies, by request id

    def broadcast(self, obj: Any = None) -> Any:
        """The engine sends `obj` (a SchedulerOutput or None) to every worker; a worker gets it back."""
        if self.rank == self.engine_rank:
            self.post(obj).wait(_IDLE_TIMEOUT)
            return obj
        return self.decode(self.receive())

    def receive(self) -> bytes:
        """A worker's side of one broadcast, still encoded (`decode` it in order, on one thread)."""
        length = torch.zeros(1, dtype=torch.long)
        self.group.broadcast(length, self.engine_rank).wait()
        if not length.item():
            return b""
        data = torch.empty(int(length.item()), dtype=torch.uint8)
        self.group.broadcast(data, self.engine_rank).wait()
        return data.numpy().tobytes()

    def decode(self, payload: bytes) -> Any:
        """What the engine posted: updates applied to this worker's copies of the requests (None for
        the empty message that ends the workers)."""
        return _decode(payload, self._held) if payload else None

    def post(self, obj: Any) -> Posted:
        """The engine's broadcast of `obj`, without waiting for it: the message is encoded now, and
        gloo's own threads deliver it while the engine plans the next step (or waits for a result).
        Posts reach the workers in order."""
        payload = self._sent.encode(obj) if obj is not None else b""  # empty: the end
        length = torch.tensor([len(payload)], dtype=torch.long)
        works = [self.group.broadcast(length, self.engine_rank)]
        if not payload:
            return Posted(works, (length,))
        data = _bytes_tensor(payload)
        return Posted(works + [self.group.broadcast(data, self.engine_rank)], (length, data))

    def send_to_engine(self, obj: Any) -> None:
        """A worker (the driver) sends `obj` to the engine."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.group.send([torch.tensor([len(payload)], dtype=torch.long)], self.engine_rank, 0).wait()
        self.group.send([_bytes_tensor(payload)], self.engine_rank, 1).wait()

    def recv_from(self, worker: int, timeout: datetime.timedelta) -> Any:
        """The engine receives what worker `worker` sent, waiting at most `timeout`."""
        length = torch.zeros(1, dtype=torch.long)
        self.group.recv([length], worker, 0).wait(timeout)
        data = torch.empty(int(length.item()), dtype=torch.uint8)
        self.group.recv([data], worker, 1).wait(timeout)
        return pickle.loads(data.numpy().tobytes())


class Posted:
    """A broadcast under way; it holds its tensors until gloo is done with them."""

    def __init__(self, works: list[Any], tensors: tuple[torch.Tensor, ...]) -> None:
        self.works = works
        self.tensors = tensors

    def wait(self, timeout: datetime.timedelta) -> None:
        """Block until every worker has the message (raises RuntimeError when a worker is gone)."""
        for work in self.works:
            work.wait(timeout)


def _bytes_tensor(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


# What a known request's update carries: request id, output tokens kept, new output tokens,
# num_computed_tokens, num_pending, block table, status, fork children's ids.
_Update = tuple[str, int, list[int], int, int, list[int], Any, list[str]]


class _SentRequests:
    """The engine's record of the requests the workers hold and how many output tokens they have."""

    def __init__(self) -> None:
        self.outputs: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()
        self.live: dict[str, weakref.ref[Request]] = {}
        self.gone: list[str] = []  # ids whose request the engine dropped, for the workers to drop too

    def encode(self, obj: Any) -> bytes:
        """Pickle `(ids gone, obj)`, new requests whole and known ones as updates."""
        buffer = io.BytesIO()
        gone, self.gone = self.gone, []
        _Pickler(buffer, self).dump((gone, obj))
        return buffer.getvalue()

    def _update(self, obj: Any, fresh: set[int]) -> _Update | None:
        if not isinstance(obj, Request):
            return None
        outputs = obj.output_token_ids
        sent = self.outputs.get(obj)
        if sent is None or id(obj) in fresh:  # new (or already whole in this message): pickled whole
            if sent is None:
                fresh.add(id(obj))
                self._track(obj)
            self.outputs[obj] = len(outputs)
            return None
        keep = min(sent, len(outputs))
        self.outputs[obj] = len(outputs)
        children = [c.request_id for c in obj.fork_children]
        return (obj.request_id, keep, outputs[keep:], obj.num_computed_tokens, obj.num_pending,
                list(obj.block_ids), obj.status, children)

    def _track(self, obj: Request) -> None:
        rid = obj.request_id

        def dropped(ref: weakref.ref[Request]) -> None:
            if self.live.get(rid) is ref:  # not replaced by a newer request of the same id
                del self.live[rid]
                self.gone.append(rid)

        self.live[rid] = weakref.ref(obj, dropped)


class _Pickler(pickle.Pickler):
    """Pickles requests the workers already hold as updates (`_SentRequests._update`)."""

    def __init__(self, buffer: io.BytesIO, sent: _SentRequests) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.sent = sent
        self.fresh: set[int] = set()

    def persistent_id(self, obj: Any) -> _Update | None:
        """An update for a known request; None pickles the object as usual."""
        return self.sent._update(obj, self.fresh)


class _Unpickler(pickle.Unpickler):
    """Applies updates to a worker's copies of the requests."""

    def __init__(self, payload: bytes, held: dict[str, Request]) -> None:
        super().__init__(io.BytesIO(payload))
        self.held = held

    def persistent_load(self, pid: Any) -> Request:
        """The held request `pid` names, brought up to date."""
        rid, keep, new, computed, pending, blocks, status, children = pid
        request = self.held[rid]
        del request.output_token_ids[keep:]
        request.output_token_ids.extend(new)
        request.num_computed_tokens, request.num_pending = computed, pending
        request.block_ids, request.status = blocks, status
        request.fork_children = [self.held[c] for c in children]
        return request


def _decode(payload: bytes, held: dict[str, Request]) -> Any:
    """A worker's side of `_SentRequests.encode`: apply updates to its copies, keep the new ones."""
    gone, obj = _Unpickler(payload, held).load()
    for rid in gone:
        held.pop(rid, None)
    if isinstance(obj, SchedulerOutput):
        for request in [s.request for s in obj.scheduled] + obj.preempted:
            _hold(request, held)
    return obj


def _hold(request: Request, held: dict[str, Request]) -> None:
    held[request.request_id] = request
    for child in request.fork_children:
        _hold(child, held)

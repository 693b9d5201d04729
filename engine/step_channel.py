"""The engine core's line to its workers: pickled objects over a gloo process group.

The engine process and the `tp x pp` workers form one gloo group of `workers + 1` ranks, the engine
last. Each step the engine broadcasts its scheduler output (a length, then the pickled bytes) and
receives the step's result from the driver worker with a point-to-point recv. torch.distributed
carries every byte; nothing here opens a socket of its own.

The group is built straight from a store (`ProcessGroupGloo(store, rank, size)`), not through
`init_process_group`, so the engine process keeps no global torch.distributed state: several engines
(and a worker's own model group) can live side by side.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import torch
import torch.distributed as dist

# Workers wait in a broadcast for the next step for as long as the server is idle: no timeout there.
_IDLE_TIMEOUT = datetime.timedelta(days=365)


class StepChannel:
    """One end of the engine-to-workers channel; `rank` is this process's rank in it."""

    def __init__(self, store: dist.Store, rank: int, num_workers: int) -> None:
        self.rank = rank
        self.engine_rank = num_workers
        # Typed Any: torch's stubs omit the collectives the gloo backend object has (broadcast, send, recv).
        self.group: Any = dist.ProcessGroupGloo(dist.PrefixStore("steps", store), rank, num_workers + 1, _IDLE_TIMEOUT)

    def broadcast(self, obj: Any = None) -> Any:
        """The engine sends `obj` to every worker; a worker gets it back."""
        length = torch.zeros(1, dtype=torch.long)
        payload = b""
        if self.rank == self.engine_rank:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            length[0] = len(payload)
        self.group.broadcast(length, self.engine_rank).wait()
        data = _bytes_tensor(payload) if payload else torch.empty(int(length.item()), dtype=torch.uint8)
        self.group.broadcast(data, self.engine_rank).wait()
        return obj if self.rank == self.engine_rank else pickle.loads(data.numpy().tobytes())

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


def _bytes_tensor(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)

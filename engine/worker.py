"""One tensor/pipeline-parallel rank: a spawned process that owns one device's share of the model.

It joins the workers' process group (gloo on the CPU, NCCL on CUDA), builds its shard of the model
and its KV pool in a `ModelRunner`, then runs every step the engine core broadcasts until it gets
`None`. The driver (tensor rank 0 of the last pipeline stage) reports the KV pool size once and each
step's sampled tokens; every rank draws the same tokens (logits are gathered on every rank), so no
rank needs another's sampler state.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from flotilla.engine.config import EngineConfig
from flotilla.engine.parallel_state import ParallelRank, init_model_parallel

if TYPE_CHECKING:
    from flotilla.engine.step_channel import StepChannel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerArgs:
    """What a spawned worker needs: its rank, the configuration and where the rendezvous store is."""

    rank: int
    config: EngineConfig
    store_host: str
    store_port: int


def driver_rank(tp_size: int, pp_size: int) -> int:
    """The worker that reports to the engine: tensor rank 0 of the last stage, where tokens are drawn."""
    return (pp_size - 1) * tp_size


def run_worker(args: WorkerArgs) -> None:
    """A worker process's main: set up, serve steps, and exit non-zero on any error (the engine's
    monitor sees the exit and fails the engine at once)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker {args.rank} %(levelname)s %(message)s")
    try:
        _serve(args)
    except BaseException:
        logger.exception("worker %d failed", args.rank)
        sys.stderr.flush()
        os._exit(1)  # skip atexit and destructors that could block on a dead peer


def _serve(args: WorkerArgs) -> None:
    from flotilla.engine.model_runner import ModelRunner  # after the spawn: torch is imported here
    from flotilla.engine.step_channel import StepChannel
    parallel = args.config.parallel
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    rank = ParallelRank.of(args.rank, tp, pp)
    config = _worker_config(args.config, rank)
    store = dist.TCPStore(args.store_host, args.store_port, is_master=False, timeout=datetime.timedelta(minutes=10))
    channel = StepChannel(store, args.rank, tp * pp)
    backend = "nccl" if config.device.device == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
    else:  # the ranks share the host's cores: oversubscribed threads spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (tp * pp)))
    init_model_parallel(rank, store, backend)
    runner = ModelRunner(config)
    driver = args.rank == driver_rank(tp, pp)
    if driver:
        channel.send_to_engine(runner.num_blocks)
    messages: queue.Queue[bytes | BaseException] = queue.Queue()
    # Steps are received ahead, on a thread of their own: with pipeline parallelism the next step
    # arrives while this rank still runs the one before, and a rank that relays the broadcast to
    # others (gloo's tree) must not hold them back until its own step ends. They are decoded here,
    # in order, because decoding updates the requests a running step reads.
    threading.Thread(target=_receive_steps, args=(channel, messages), name="flotilla-steps", daemon=True).start()
    while True:
        message = messages.get()
        if isinstance(message, BaseException):
            raise message
        plan = channel.decode(message)
        if plan is None:
            break
        result = runner.execute(plan)
        if driver:
            channel.send_to_engine(result)
    dist.destroy_process_group()


def _receive_steps(channel: StepChannel, messages: queue.Queue[bytes | BaseException]) -> None:
    """Put every message the engine broadcasts into `messages` until the engine's last (None), or
    the error that ended them."""
    try:
        while True:
            message = channel.receive()
            messages.put(message)
            if not message:  # the engine's last: stop receiving
                return
    except BaseException as exc:
        messages.put(exc)


def _worker_config(config: EngineConfig, rank: ParallelRank) -> EngineConfig:
    """CUDA graphs cannot hold a pipeline stage's send/recv: stages run eagerly."""
    if rank.pp_size == 1 or config.model.enforce_eager:
        return config
    if rank.rank == 0:
        logger.info("pipeline parallelism: stages run without CUDA graphs")
    return config.model_copy(update={"model": config.model.model_copy(update={"enforce_eager": True})})

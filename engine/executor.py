"""Runs the engine core's steps on the model: in this process, or on `tp x pp` spawned workers.

At `-tp 1 -pp 1` the executor is the `ModelRunner` itself. Otherwise `MultiprocExecutor` spawns one
worker process per rank (`engine/worker.py`), and each step broadcasts the scheduler output to all
of them over a `StepChannel` and receives the sampled tokens from the driver. The scheduler and the
block manager stay in the engine core, once.

A dead worker fails the engine fast: a monitor thread watches every worker's process sentinel; when
one exits it stops the others, so a collective the engine is blocked in errors out at once (gloo
reports the closed connection), and the engine raises `WorkerDiedError` naming the rank and its exit
code. A step that takes longer than `STEP_TIMEOUT` (a hung worker) fails the same way.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist

from flotilla.engine.config import EngineConfig
from flotilla.engine.model_runner import LaunchedStep, ModelRunner, StepOutput, StepTiming
from flotilla.engine.scheduler import SchedulerOutput
from flotilla.engine.step_channel import Posted, StepChannel
from flotilla.engine.worker import WorkerArgs, driver_rank, run_worker

logger = logging.getLogger(__name__)

# Longest wait for one step's result (vLLM's multiprocessing executor waits 300 s by default too).
STEP_TIMEOUT = datetime.timedelta(seconds=300)
# Longest wait for the workers to load the model and report their KV pool.
STARTUP_TIMEOUT = datetime.timedelta(minutes=30)


class WorkerDiedError(RuntimeError):
    """A tensor/pipeline-parallel worker exited or stopped answering; the engine cannot go on."""


def build_executor(config: EngineConfig) -> ModelRunner | MultiprocExecutor:
    """The model runner in this process at one rank, spawned workers otherwise."""
    parallel = config.parallel
    if parallel.tensor_parallel_size * parallel.pipeline_parallel_size == 1:
        return ModelRunner(config)
    return MultiprocExecutor(config)


class MultiprocExecutor:
    """The engine core's side of `tp x pp` worker processes: same step interface as `ModelRunner`."""

    def __init__(self, config: EngineConfig) -> None:
        parallel = config.parallel
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        self.num_workers = tp * pp
        if config.device.device == "cuda" and torch.cuda.device_count() < self.num_workers:
            raise ValueError(
                f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} needs {self.num_workers} GPUs; "
                f"this machine has {torch.cuda.device_count()}"
            )
        self.driver = driver_rank(tp, pp)
        self.last_step = StepTiming()
        self._failure: str | None = None
        self._posted: deque[Posted] = deque()  # broadcasts of the steps launched and not collected
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ctx = multiprocessing.get_context("spawn")  # CUDA and gloo threads do not survive fork
        self.workers: list[BaseProcess] = [
            ctx.Process(
                target=run_worker,
                args=(WorkerArgs(rank, config, "127.0.0.1", self._store.port),),
                name=f"flotilla-worker-{rank}",
                daemon=True,
            )
            for rank in range(self.num_workers)
        ]
        for w in self.workers:
            w.start()
        self._finalizer = weakref.finalize(self, _stop, self.workers)
        logger.info("started %d workers (tensor parallel %d x pipeline parallel %d)", self.num_workers, tp, pp)
        self.channel = self._connect()
        threading.Thread(target=self._monitor, name="flotilla-worker-monitor", daemon=True).start()
        num_blocks = self._receive(STARTUP_TIMEOUT)  # the driver's first message: the KV pool all ranks fit
        assert isinstance(num_blocks, int)
        self.num_blocks = num_blocks

    def _connect(self) -> StepChannel:
        """Build the step channel; its rendezvous waits for every worker, so watch them meanwhile."""
        box: list[StepChannel | BaseException] = []

        def connect() -> None:
            try:
                box.append(StepChannel(self._store, self.num_workers, self.num_workers))
            except BaseException as exc:
                box.append(exc)

        thread = threading.Thread(target=connect, name="flotilla-step-channel", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
            if dead := self._dead_worker():
                _stop(self.workers)
                raise WorkerDiedError(f"{dead} while starting; see its log above")
        result = box[0]
        if isinstance(result, BaseException):
            raise WorkerDiedError(f"the workers did not connect: {result}") from result
        return result

    def _dead_worker(self) -> str | None:
        for rank, w in enumerate(self.workers):
            if w.exitcode is not None:
                return f"worker rank {rank} (pid {w.pid}) exited with code {w.exitcode}"
        return None

    def _monitor(self) -> None:
        """Wait for any worker to exit; then stop the rest, so no one stays blocked on it."""
        ready = wait([w.sentinel for w in self.workers])
        if self._finalizer.alive:  # not a shutdown we asked for
            with _REAP_LOCK:
                for w in self.workers:
                    if w.sentinel in ready:
                        w.join(1)  # the sentinel fires as it exits; reap it so the exit code is known
            self._failure = self._dead_worker() or "a worker exited"
            logger.error("%s; stopping the other workers", self._failure)
            _stop(self.workers)

    def _receive(self, timeout: datetime.timedelta) -> object:
        try:
            return self.channel.recv_from(self.driver, timeout)
        except RuntimeError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> WorkerDiedError:
        deadline = time.monotonic() + 5  # give the monitor a moment to name the worker that died
        while self._failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        _stop(self.workers)
        reason = self._failure or f"a worker stopped answering ({exc})"
        return WorkerDiedError(f"tensor/pipeline-parallel {reason}; the engine cannot continue")

    # --- the ModelRunner step interface --------------------------------------------------------------

    def execute(self, out: SchedulerOutput) -> StepOutput:
        """Run one step on every worker and return the driver's tokens."""
        return self.collect(self.launch(out))

    def check_health(self) -> None:
        """Raise `WorkerDiedError` once any worker has exited (the others stopped first)."""
        if self._failure is not None:
            # The monitor thread names the failure before it stops the other workers; stopping them here too
            # (idempotent) means no caller ever sees the error while a worker still runs.
            _stop(self.workers)
            raise WorkerDiedError(f"tensor/pipeline-parallel {self._failure}; the engine cannot continue")

    def launch(self, out: SchedulerOutput) -> LaunchedStep:
        """Send the step to the workers without waiting for them: the engine plans the next step (or,
        with pipeline parallelism, launches it into the first stage) while this one runs."""
        self.check_health()
        start = time.perf_counter()
        try:
            self._posted.append(self.channel.post(out))
        except RuntimeError as exc:
            raise self._error(exc) from exc
        return LaunchedStep(start=start, graphed=False, rows=[], host_s=time.perf_counter() - start)

    def collect(self, step: LaunchedStep) -> StepOutput:
        """Wait for the oldest launched step's output (steps are collected in launch order)."""
        posted = self._posted.popleft()
        try:
            posted.wait(STEP_TIMEOUT)
        except RuntimeError as exc:
            raise self._error(exc) from exc
        result = self._receive(STEP_TIMEOUT)
        assert isinstance(result, StepOutput)
        self.last_step = StepTiming(step.host_s, time.perf_counter() - step.start, False)
        return result

    def shutdown(self, timeout: float = 10.0) -> None:
        """Tell the workers to exit and wait for them (stopping any that do not)."""
        if not self._finalizer.alive:
            return
        self._finalizer.detach()
        if self._failure is None:
            with contextlib.suppress(RuntimeError):  # a worker is already gone: all are stopped below
                self.channel.broadcast(None)
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.join(max(deadline - time.monotonic(), 0))
        _stop(self.workers)


# Reaping is serialised: the monitor thread and the engine's thread may both stop the workers, and two threads
# joining one process race in waitpid (the loser gets ECHILD and, until the winner stores the exit code, reads
# the process as still running).
_REAP_LOCK = threading.Lock()


def _stop(workers: list[BaseProcess]) -> None:
    """Kill every worker still running and reap it."""
    with _REAP_LOCK:
        for w in workers:
            if w.exitcode is None:
                w.kill()
        for w in workers:
            w.join(5)

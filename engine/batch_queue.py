"""Pipeline parallelism's batch queue: up to `pp` steps in flight, so the stages work at once.

With the layers split over `pp` stages, one step at a time leaves all stages but one idle. As vLLM's
pipeline scheduling does, the engine launches a new step while earlier ones are still in later
stages, up to `pp` of them, and only then waits for the oldest. A request in a step in flight is left
out of new steps until its step returns (its next input token is not known before), so the steps in
flight hold different requests, and each step takes at most its share of the running requests so that
decoding requests spread over the steps instead of riding in one.
"""

from __future__ import annotations

import math
from collections import deque

from flotilla.engine.config import EngineConfig
from flotilla.engine.executor import MultiprocExecutor
from flotilla.engine.model_runner import LaunchedStep, StepOutput
from flotilla.engine.request import Request
from flotilla.engine.scheduler import Scheduler, SchedulerOutput


class BatchQueue:
    """The steps in flight, oldest first, and the rule for launching one more."""

    def __init__(self, depth: int, scheduler: Scheduler, executor: MultiprocExecutor) -> None:
        self.depth = depth
        self.scheduler = scheduler
        self.executor = executor
        self.in_flight: deque[tuple[SchedulerOutput, LaunchedStep]] = deque()
        self.peak = 0  # the most steps ever in flight at once (tests: the stages did get to overlap)

    def __len__(self) -> int:
        return len(self.in_flight)

    def step(self) -> tuple[SchedulerOutput, StepOutput] | None:
        """Launch a step if there is room and work for it; when the queue is full (or nothing new
        could be planned), wait for the oldest step and return it with its output."""
        if len(self.in_flight) < self.depth and self._launch() and len(self.in_flight) < self.depth:
            return None  # room for another step: plan it before waiting on any
        if not self.in_flight:
            return None
        plan, launched = self.in_flight.popleft()
        return plan, self.executor.collect(launched)

    def _launch(self) -> bool:
        busy: set[Request] = {s.request for plan, _ in self.in_flight for s in plan.scheduled}
        free = sum(1 for r in self.scheduler.running if r not in busy) + len(self.scheduler.waiting)
        # This step's share of the requests not in flight: the rest go to the steps launched after it.
        share = math.ceil(free / (self.depth - len(self.in_flight))) if free else None
        self.scheduler.busy = busy
        try:
            plan = self.scheduler.schedule(max_seqs=share)
        finally:
            self.scheduler.busy = ()
        if plan.is_empty:
            return False
        self.in_flight.append((plan, self.executor.launch(plan)))
        self.peak = max(self.peak, len(self.in_flight))
        return True


def build_batch_queue(config: EngineConfig, scheduler: Scheduler, runner: object) -> BatchQueue | None:
    """A batch queue `pp` deep with pipeline parallelism; None (one step at a time) otherwise, and
    with speculative decoding, whose proposals read the tokens of the step before."""
    depth = config.parallel.pipeline_parallel_size
    if depth == 1 or config.speculative is not None or not isinstance(runner, MultiprocExecutor):
        return None
    return BatchQueue(depth, scheduler, runner)

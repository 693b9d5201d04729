"""Continuous batching: which requests run in the next step, and how many tokens each feeds.

Plain Python (no torch). Every step: running requests first (decodes, and the next chunk of prompts
being prefilled in chunks), then waiting requests in FIFO order, all under a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`). When the KV pool runs dry, the newest
running request is preempted: its blocks are freed and it will be recomputed later (its prefix is
likely still cached).

With `--scheduling-policy priority` (vLLM's policy) the waiting queue is kept in (priority, arrival)
order, lower values first, running requests are planned in that order, and the running request with
the largest (priority, arrival) is the one preempted. A waiting request that cannot be admitted for
want of a sequence slot or blocks preempts running requests of a strictly lower priority (larger
value) until it fits, as vLLM's V0 scheduler did (V1 only preempts for running requests: vLLM issue
#40004); equal priorities never preempt each other, so two requests cannot evict each other in turn. Its
adapter counts too: a request that --max-loras keeps out preempts lower-priority requests until their adapters
make room, and none when higher-priority ones hold the adapter slots (the victims would be taken back at once
and preempted again, step after step).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import SchedulerConfig
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.spec_decode.policy import request_can_speculate


@dataclass
class ScheduledRequest:
    """A request in this step, feeding `num_new_tokens` tokens from `num_computed_tokens` on."""

    request: Request
    num_new_tokens: int
    num_computed_tokens: int
    samples: bool  # the step reaches the end of the request's tokens, so it draws the next one
    # Speculative decoding: KV slots reserved after the last known token for draft tokens, and the
    # drafts the proposer put there (at most num_lookahead; `num_new_tokens` counts them).
    num_lookahead: int = 0
    spec_token_ids: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """One step's plan, consumed by the model runner."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write, before the step

    @property
    def num_batched_tokens(self) -> int:
        """Tokens fed to the model in this step."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to run."""
        return not self.scheduled


class Scheduler:
    """Holds the waiting and running queues and decides each step."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_loras: int | None = None) -> None:
        self.config = config
        # Pipeline parallelism: requests in steps still in flight, left out of new steps (`schedule`).
        self.busy: Collection[Request] = ()
        self.max_loras = max_loras  # distinct LoRA adapters among running requests (None: no LoRA)
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # Sleep mode's "wait": requests that never ran stay queued, so that the running ones drain (preempted
        # ones and waiting completions of a running request still go on: they are in flight).
        self.hold_new = False

    def add(self, request: Request, by_arrival: bool = False) -> None:
        """Queue a new request (FIFO, or by priority under the priority policy).

        `by_arrival`: under FIFO, a request that arrived before some that wait already (it waited for its
        grammar to compile, as vLLM's WAITING_FOR_FSM requests keep their place) goes ahead of those that
        arrived after it and have never run; preempted requests stay ahead of it."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        if by_arrival and self.config.scheduling_policy != "priority":
            waiting = self.waiting
            index = len(waiting)
            while index and waiting[index - 1].first_scheduled_time is None \
                    and waiting[index - 1].arrival_time > request.arrival_time:
                index -= 1
            waiting.insert(index, request)
            return
        self._enqueue(request, front=False)

    def _enqueue(self, request: Request, front: bool) -> None:
        """Put a request in the waiting queue: at the back (new) or the front (preempted) under FCFS,
        at its (priority, arrival) place under the priority policy."""
        if self.config.scheduling_policy == "priority":
            bisect.insort(self.waiting, request, key=_priority_key)
        elif front:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def _pop_victim(self, start: int) -> Request:
        """Remove and return the running request to preempt, among those not yet planned this step
        (`running[start:]`) and not in a step in flight: the newest, or the one with the largest
        (priority, arrival)."""
        candidates = [r for r in self.running[start:] if r not in self.busy] if self.busy else self.running[start:]
        fcfs = self.config.scheduling_policy != "priority"
        victim = candidates[-1] if fcfs else max(candidates, key=_priority_key)
        if victim is self.running[-1]:
            return self.running.pop()
        self.running.remove(victim)
        return victim

    def has_unfinished(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting or self.running)

    def has_started(self) -> bool:
        """True while any request runs or waits to go on (preempted, or a completion waiting for a slot)."""
        return bool(self.running) or any(r.status == RequestStatus.PREEMPTED for r in self.waiting)

    def preempt_all(self) -> None:
        """Preempt every running request (their blocks freed, recomputed when they run again), in order: they go
        on first, as they were."""
        for request in reversed(self.running):
            self._preempt(request)
        self.running.clear()

    def schedule(self, num_lookahead: int = 0, max_seqs: int | None = None) -> SchedulerOutput:
        """Plan the next step; decoding requests get up to `num_lookahead` extra KV slots for drafts.

        With pipeline parallelism several steps are in flight: requests in them (`busy`) are left out
        (their next input is not known yet, and their blocks are in use), and `max_seqs` caps this
        step's sequences so that the running requests spread over the steps in flight.
        """
        out = SchedulerOutput()
        if self.config.scheduling_policy == "priority":
            self.running.sort(key=_priority_key)  # victims come from the tail: the lowest priority
            self._preempt_for_waiting(out)
        made_room = len(out.preempted)
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget, num_lookahead, max_seqs)
        if len(out.preempted) == made_room:  # a running request short of blocks stops admissions
            self._schedule_waiting(out, budget, max_seqs)
        out.block_copies = self.block_manager.take_pending_copies()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, num_lookahead: int, max_seqs: int | None) -> int:
        i = 0
        while i < len(self.running) and budget > 0 and (max_seqs is None or len(out.scheduled) < max_seqs):
            request = self.running[i]
            if self.busy and request in self.busy:
                i += 1
                continue
            if request.num_pending and self._length_reached(request, request.num_output_tokens + request.num_pending):
                i += 1  # its token in flight is its last: a step for it would be wasted
                continue
            num_new = min(request.num_tokens + request.num_pending - request.num_computed_tokens, budget)
            lookahead = self._lookahead(request, num_new, budget, num_lookahead)
            if lookahead and not self.block_manager.allocate(request, num_new + lookahead):
                lookahead = 0  # no room for drafts: decode one token rather than preempt anyone
            while not lookahead and not self.block_manager.allocate(request, num_new):
                victim = self._pop_victim(i)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                self._plan(out, request, num_new, request.num_computed_tokens, lookahead)
                budget -= num_new + lookahead
                i += 1
        return budget

    def _preempt_for_waiting(self, out: SchedulerOutput) -> None:
        """Priority policy: preempt running requests of strictly lower priority than the first waiting
        one (the lowest first) until it has a sequence slot and blocks for its first chunk and every
        running request has a block for its next token."""
        if not self.waiting:
            return
        head = self.waiting[0]
        if self._held(head):  # it will not start: preempting for it would only make others recompute
            return
        if self._adapter_kept_out(head):  # no preemption would let it in: the victims would only recompute
            return
        while not self._fits(head):
            candidates = [r for r in self.running if r not in self.busy] if self.busy else self.running
            if not candidates or candidates[-1].priority <= head.priority:
                return
            victim = candidates[-1]
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim)

    def _adapter_kept_out(self, request: Request) -> bool:
        """Priority policy: whether a waiting request's adapter would exceed --max-loras beside the running requests
        that no preemption for it may remove (its priority or a higher one, or in a step in flight)."""
        kept = {r.lora_request.lora_int_id for r in self.running
                if r.lora_request is not None and (r.priority <= request.priority or r in self.busy)}
        return self._lora_full(request, kept)

    def _fits(self, request: Request) -> bool:
        """Whether a waiting request could be admitted next to the running ones (an estimate: its
        prompt's cached prefix is not counted, so it errs towards preempting)."""
        if len(self.running) >= self.config.max_num_seqs:  # one slot to start, as `_schedule_waiting` admits
            return False
        running_loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
        if self._lora_full(request, running_loras):  # as `_schedule_waiting` would skip it
            return False
        bm = self.block_manager
        first = request.num_tokens - request.num_computed_tokens
        if self.config.enable_chunked_prefill:
            first = min(first, self.config.max_num_batched_tokens)
        growth = sum(max(bm.blocks_needed(r.num_tokens + r.num_pending) - len(r.block_ids), 0)
                     for r in self.running)
        return bm.blocks_needed(request.num_computed_tokens + first) + growth <= bm.num_free_blocks

    def _lookahead(self, request: Request, num_new: int, budget: int, num_lookahead: int) -> int:
        """Draft slots for a request that decodes its last known token: never past what the budget,
        max_tokens or the context length could still use (the step outputs up to lookahead + 1 tokens)."""
        if not num_lookahead or num_new != 1 or request.num_pending or not request_can_speculate(request):
            return 0
        room = min(num_lookahead, budget - 1, self.config.max_model_len - request.num_tokens - 1)
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - request.num_output_tokens - 1)
        return max(room, 0)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, max_seqs: int | None) -> None:
        # Requests of an adapter that would exceed --max-loras wait their turn; the others go past them.
        loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
        skipped: list[Request] = []
        while self.waiting and budget > 0 and (max_seqs is None or len(out.scheduled) < max_seqs):
            request = self.waiting[0]
            if self._held(request) or self._lora_full(request, loras):
                skipped.append(self.waiting.popleft())
                continue
            # A request with n completions needs one slot to start: its completions fork into the slots free when
            # its prompt is done, and the rest wait for slots of their own (`_fork`), as vLLM queues each
            # completion as a request. (Waiting for n free slots at once held every request queued behind it until
            # the batch had drained that far: to empty when n >= --max-num-seqs.)
            if len(self.running) >= self.config.max_num_seqs:
                break
            cached = self.block_manager.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            num_computed = request.num_computed_tokens + len(cached) * self.block_manager.block_size
            num_new = request.num_tokens - num_computed
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.block_manager.allocate(request, num_new, cached):
                break
            self.waiting.popleft()
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
            if request.num_cached_tokens < 0:  # the first admission's hit, not a resumed one's (as vLLM)
                request.num_cached_tokens = num_computed
                self.block_manager.record_lookup(request, len(cached))
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._plan(out, request, num_new, num_computed)
            budget -= num_new
            if request.lora_request is not None:
                loras.add(request.lora_request.lora_int_id)
        self.waiting.extendleft(reversed(skipped))

    def _held(self, request: Request) -> bool:
        """True for a request that never ran while new ones are held (`hold_new`)."""
        return self.hold_new and request.status == RequestStatus.WAITING

    def _lora_full(self, request: Request, loras: set[int]) -> bool:
        """True when admitting `request` would put more distinct adapters in the batch than --max-loras."""
        lora = request.lora_request
        return lora is not None and self.max_loras is not None and lora.lora_int_id not in loras \
            and len(loras) >= self.max_loras

    @staticmethod
    def _plan(out: SchedulerOutput, request: Request, num_new: int, num_computed: int, lookahead: int = 0) -> None:
        """Put the request in the step and advance its progress now, so the next step can be planned
        before this one's tokens are known; a token it draws is pending until `update`. Lookahead
        slots count as planned until the proposer fills them (`spec_decode.drafts`)."""
        end = num_computed + num_new
        samples = end == request.num_tokens + request.num_pending
        end += lookahead
        out.scheduled.append(ScheduledRequest(request, num_new + lookahead, num_computed, samples, lookahead))
        request.num_computed_tokens = end
        if samples:
            request.num_pending += 1

    def _length_reached(self, request: Request, num_output: int) -> bool:
        """Whether `num_output` generated tokens end the request by max_tokens or the context length."""
        max_tokens = request.sampling_params.max_tokens
        return (max_tokens is not None and num_output >= max_tokens) or (
            len(request.prompt_token_ids) + num_output >= self.config.max_model_len
        )

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self._enqueue(request, front=True)
        self.num_preemptions += 1

    def update(
        self, out: SchedulerOutput, sampled: dict[str, int], verified: dict[str, list[int]] | None = None
    ) -> list[Request]:
        """Record a finished step: append the drawn tokens, retire finished requests.

        Returns the requests that received a token in this step (finished ones included). With
        asynchronous scheduling the next step is already planned: a request that finishes here
        may be in it, and its token there is discarded.

        A request that had drafts gets its `verified` tokens (accepted drafts, then one more) one at a
        time, as if decoded step by step: a stop ends it at that token, and the list is cut to the
        tokens it kept. Its KV beyond its known tokens is then rolled back (`_roll_back`).
        """
        touched: list[Request] = []
        for s in out.scheduled:
            if not s.samples:  # a prompt chunk that does not reach the end yet
                continue
            request = s.request
            request.num_pending -= 1
            if request.status.finished:  # aborted (or stopped) while the step ran
                continue
            if s.spec_token_ids and verified is not None:
                self._append_verified(request, verified[request.request_id], touched)
                continue
            children = request.fork_children
            if children:  # detached first: finishing the leader must not finish them
                request.fork_children = []
            # Forked before the leader's token: a leader that stops on it frees its blocks, which the
            # children must already share (forked after, they got no prompt K/V at all).
            queued = [child for child in children
                      if not self._fork(request, child, s.num_computed_tokens + s.num_new_tokens)]
            for child in reversed(queued):  # at the queue's front in index order
                self._enqueue(child, front=True)
            self._append_token(request, sampled[request.request_id], touched)
            if s.num_lookahead and not request.status.finished:  # draft slots the proposer left empty
                self.block_manager.trim(request, request.num_tokens)
            for child in children:
                self._append_token(child, sampled[child.request_id], touched)
        return touched

    def _append_verified(self, request: Request, tokens: list[int], touched: list[Request]) -> None:
        for kept, token in enumerate(tokens, 1):
            request.output_token_ids.append(token)
            status = self._stop_status(request, token)
            if status is not None:
                del tokens[kept:]
                self.finish(request, status)
                break
        touched.append(request)
        if not request.status.finished:
            self._roll_back(request)

    def _roll_back(self, request: Request) -> None:
        """After verification: K/V is valid up to the last accepted token (the new last token is fed
        next step), and blocks past the known tokens, which held only rejected drafts, go back."""
        request.num_computed_tokens = request.num_tokens - 1
        self.block_manager.trim(request, request.num_tokens)

    def _append_token(self, request: Request, token: int, touched: list[Request]) -> None:
        request.output_token_ids.append(token)
        status = self._stop_status(request, token)
        if status is not None:
            self.finish(request, status)
        touched.append(request)

    def _fork(self, leader: Request, child: Request, num_prompt_computed: int) -> bool:
        """Start a sibling completion on the leader's computed prompt, sharing its blocks. (The
        leader may already be planned a token further; the child starts at the prompt's end.) Returns
        False when the child cannot run yet: the caller queues it."""
        child.prompt_logprobs = leader.prompt_logprobs
        self.requests[child.request_id] = child
        child.num_cached_tokens = self.block_manager.fork_lookup(child)  # before its first token is appended
        if leader.status == RequestStatus.PREEMPTED or len(self.running) >= self.config.max_num_seqs:
            # Preempted while this step ran (asynchronous scheduling): its blocks are back in the pool, so
            # the child has none to share and waits, like its leader, to be recomputed from its prompt. Or
            # n > the sequences left under --max-num-seqs: it waits for a slot (vLLM queues each completion as
            # a request of its own), holding no blocks; the prompt's are in the prefix cache for it.
            child.status = RequestStatus.PREEMPTED
            return False
        self.block_manager.fork(leader, child, num_prompt_computed)
        child.num_computed_tokens = num_prompt_computed
        child.status = RequestStatus.RUNNING
        self.running.append(child)
        return True

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        num_output = len(request.output_token_ids)  # read once: this runs per request per step
        if num_output >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                if token != request.eos_token_id:
                    request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
            if token in request.stop_token_set:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if self._length_reached(request, num_output):
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Retire a request (stopped, length or aborted) and return its blocks to the pool."""
        if request.status.finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        for child in request.fork_children:  # completions that never started end with their leader
            child.status = status
        self.block_manager.free(request)
        del self.requests[request.request_id]

    def abort(self, request_ids: Iterable[str]) -> list[Request]:
        """Abort requests by id at any time; unknown or finished ids are ignored."""
        aborted = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.finish(request, RequestStatus.FINISHED_ABORTED)
                aborted.append(request)
        return aborted


def _priority_key(request: Request) -> tuple[int, float]:
    """The priority policy's order: lower priority value first, then earlier arrival."""
    return request.priority, request.arrival_time

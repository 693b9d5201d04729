"""Each penalised request's token counts on the device, brought up to date with its new output tokens only.

The repetition, frequency and presence penalties read how often each token occurs in a request's output so far
and whether it occurs in its prompt. Rebuilt from the token lists every step, that cost a step O(output length)
per row (every list padded into a tensor and counted again). Here a request gets a row of two persistent tables
at its first penalised draw (its prompt marked then, once), and a step adds only the output tokens that came
since: one indexed add for the whole batch. The counts are the same integers as a recount (int32, exact), so the
penalised logits are bit for bit those of a recount.

The tables have a row for each of `max_num_seqs` requests (the most one batch holds) besides row 0, which rows
whose own parameters have no penalty read and which stays all zero. They are made at the first penalised draw,
whole, and never grow, so the KV cache's sizing can set their bytes aside (`table_bytes`, charged to the engine's
memory budget in engine/memory_profile.py): 5 bytes a token of the vocabulary a row (int32 counts, bool marks),
e.g. 330 MB at 512 rows and a 128k vocabulary. A row is taken back when its request has finished (or is gone) and
a new request needs one; when every row is held by a live request, one outside the batch (preempted, say) gives its
row up and is counted again from scratch at its next draw. Rows are kept under the request's id (its completion id:
unique among live requests, `LLMEngine._check_unique`), with a weak reference to the request that holds it, so a new
request that reuses a finished one's id is told apart and counted from scratch.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from flotilla.engine.request import Request
from flotilla.engine.staging import device_tensor


@dataclass
class _Slot:
    """A request's row of the tables, and how many of its output tokens the row has counted."""

    owner: weakref.ref[Request]
    row: int
    counted: int = 0


def table_bytes(max_requests: int, vocab_size: int) -> int:
    """The two tables' bytes for `max_requests` rows (and row 0) over a `vocab_size`-wide vocabulary."""
    per_cell = torch.empty(0, dtype=torch.int32).element_size() + torch.empty(0, dtype=torch.bool).element_size()
    return (max_requests + 1) * (vocab_size + 1) * per_cell


class PenaltyCounts:
    """Persistent `[max_requests + 1, V + 1]` tables: each penalised request's output token counts and its prompt's
    tokens (column V is the pad column of the sampler's conventions; nothing reads it)."""

    def __init__(self, device: torch.device, max_requests: int) -> None:
        self.device = device
        self.max_requests = max_requests  # distinct requests one batch may hold: the scheduler's max_num_seqs
        self.vocab_size = -1
        self.output = torch.zeros(0, 0, dtype=torch.int32, device=device)  # [rows, V + 1] occurrences in outputs
        self.prompt = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [rows, V + 1] occurs in the prompt
        self._slots: dict[str, _Slot] = {}  # request id -> its row
        self._free: list[int] = []
        self.tokens_counted = 0  # prompt and output tokens added to the tables so far (what a recount would redo)

    def rows(self, requests: list[Request | None], vocab_size: int) -> torch.Tensor:
        """Each request's row of the tables (`[B]` int64 on the device; row 0, all zero, for None), its counts
        brought up to date with the output tokens it has now."""
        if vocab_size != self.vocab_size:  # first use (or another vocabulary): fresh tables
            self._reset(vocab_size)
        fresh: list[int] = []  # rows given to a request now: cleared, then its prompt marked
        prompt_rows: list[int] = []
        prompt_tokens: list[int] = []
        out_rows: list[int] = []
        out_tokens: list[int] = []
        batch = {r.request_id: r for r in requests if r is not None}
        # A request's completions draw their first tokens together, each as a row of the batch, before the
        # scheduler runs them (`Request.fork_children`); with no output yet, their counts are their shared prompt's
        # alone: those of one row. So they read the row of the first of them, and a batch holds at most as many
        # rows of its own as requests run at once (max_num_seqs), whatever their n.
        # id(prompt ids) -> the row of this batch's request with them and no output (the lists live through this call)
        first_draws: dict[int, int] = {}
        rows = []
        for r in requests:
            if r is None:
                rows.append(0)
                continue
            slot = self._slots.get(r.request_id)
            outputs = r.output_token_ids
            if not outputs and (slot is None or slot.owner() is not r) and id(r.prompt_token_ids) in first_draws:
                rows.append(first_draws[id(r.prompt_token_ids)])
                continue
            if slot is None or slot.owner() is not r or len(outputs) < slot.counted:
                slot = self._take(r, slot, batch)
                fresh.append(slot.row)
                prompt_rows += [slot.row] * len(r.prompt_token_ids)
                prompt_tokens += r.prompt_token_ids
            if len(outputs) > slot.counted:
                new = outputs[slot.counted :]
                out_rows += [slot.row] * len(new)
                out_tokens += new
                slot.counted = len(outputs)
            if not outputs:
                first_draws.setdefault(id(r.prompt_token_ids), slot.row)
            rows.append(slot.row)
        self._write(fresh, prompt_rows, prompt_tokens, out_rows, out_tokens)
        return device_tensor(rows, torch.long, self.device)

    def _reset(self, vocab_size: int) -> None:
        """The tables at their full size (their bytes: `table_bytes`), every row but row 0 free."""
        rows = self.max_requests + 1
        self.vocab_size = vocab_size
        self.output = torch.zeros(rows, vocab_size + 1, dtype=torch.int32, device=self.device)
        self.prompt = torch.zeros(rows, vocab_size + 1, dtype=torch.bool, device=self.device)
        self._slots.clear()
        self._free = list(range(rows - 1, 0, -1))  # the lowest first

    def _take(self, request: Request, slot: _Slot | None, batch: dict[str, Request]) -> _Slot:
        """A row for `request`: the row kept under its id (its own, recounted from scratch, or that of a finished
        request whose id it reuses), else a free one."""
        if slot is None:
            if not self._free:
                self._sweep(batch)
            if not self._free:
                self._evict(batch)
        row = slot.row if slot is not None else self._free.pop()
        self._slots[request.request_id] = slot = _Slot(weakref.ref(request), row)
        return slot

    def _sweep(self, batch: dict[str, Request]) -> None:
        """Free the rows of requests that are gone, and of those that have finished outside this batch (a request of
        this batch may reuse a finished one's id: the row's holder is told by identity)."""
        for key, slot in list(self._slots.items()):
            owner = slot.owner()
            if owner is None or (batch.get(key) is not owner and owner.status.finished):
                del self._slots[key]
                self._free.append(slot.row)

    def _evict(self, batch: dict[str, Request]) -> None:
        """Free the row of a live request outside the batch (the earliest taken): its counts are taken again, from
        scratch, at its next draw. A batch of more requests than the tables have rows is a caller's error."""
        key = next((k for k, slot in self._slots.items() if batch.get(k) is not slot.owner()), None)
        if key is None:
            raise RuntimeError(f"a batch holds more than {self.max_requests} penalised requests (max_num_seqs)")
        self._free.append(self._slots.pop(key).row)

    def _write(self, fresh: list[int], prompt_rows: list[int], prompt_tokens: list[int], out_rows: list[int],
               out_tokens: list[int]) -> None:
        """Clear the fresh rows, mark their prompts, add the new output tokens: a few device operations a step."""
        if fresh:
            cleared = device_tensor(fresh, torch.long, self.device)
            self.output[cleared] = 0
            self.prompt[cleared] = False
        if prompt_rows:
            at = (device_tensor(prompt_rows, torch.long, self.device),
                  device_tensor(prompt_tokens, torch.long, self.device))
            self.prompt[at] = True
        if out_rows:
            at = (device_tensor(out_rows, torch.long, self.device), device_tensor(out_tokens, torch.long, self.device))
            self.output.index_put_(at, torch.ones(len(out_rows), dtype=torch.int32, device=self.device),
                                   accumulate=True)
        self.tokens_counted += len(prompt_tokens) + len(out_tokens)

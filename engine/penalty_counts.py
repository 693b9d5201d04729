"""Each penalised request's token counts on the device, brought up to date with its new output tokens only.

The repetition, frequency and presence penalties read how often each token occurs in a request's output so far
and whether it occurs in its prompt. Rebuilt from the token lists every step, that cost a step O(output length)
per row (every list padded into a tensor and counted again). Here a request gets a row of two persistent tables
at its first penalised draw (its prompt marked then, once), and a step adds only the output tokens that came
since: one indexed add for the whole batch. The counts are the same integers as a recount (int32, exact), so the
penalised logits are bit for bit those of a recount.

A row is taken back when its request has finished (or is gone) and a new request needs one; the tables grow
by doubling when none is free. Rows whose own parameters have no penalty read row 0, which stays all zero.
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


class PenaltyCounts:
    """Persistent `[rows, V + 1]` tables: each penalised request's output token counts and its prompt's tokens
    (column V is the pad column of the sampler's conventions; nothing reads it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.vocab_size = -1
        self.output = torch.zeros(0, 0, dtype=torch.int32, device=device)  # [rows, V + 1] occurrences in outputs
        self.prompt = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [rows, V + 1] occurs in the prompt
        self._slots: dict[int, _Slot] = {}  # id(request) -> its row
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
        batch = {id(r) for r in requests if r is not None}
        rows = []
        for r in requests:
            if r is None:
                rows.append(0)
                continue
            slot = self._slots.get(id(r))
            outputs = r.output_token_ids
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
            rows.append(slot.row)
        self._write(fresh, prompt_rows, prompt_tokens, out_rows, out_tokens)
        return device_tensor(rows, torch.long, self.device)

    def _reset(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.output = torch.zeros(1, vocab_size + 1, dtype=torch.int32, device=self.device)
        self.prompt = torch.zeros(1, vocab_size + 1, dtype=torch.bool, device=self.device)
        self._slots.clear()
        self._free.clear()

    def _take(self, request: Request, slot: _Slot | None, batch: set[int]) -> _Slot:
        """A row for `request`: the row kept under its id (its own, recounted from scratch, or a gone request's whose
        id it now has: two live objects never share an id), else a free one."""
        if slot is None:
            if not self._free:
                self._sweep(batch)
            if not self._free:
                self._grow()
        row = slot.row if slot is not None else self._free.pop()
        self._slots[id(request)] = slot = _Slot(weakref.ref(request), row)
        return slot

    def _sweep(self, batch: set[int]) -> None:
        """Free the rows of requests that have finished or are gone (none of this batch's)."""
        for key, slot in list(self._slots.items()):
            owner = slot.owner()
            if key not in batch and (owner is None or owner.status.finished):
                del self._slots[key]
                self._free.append(slot.row)

    def _grow(self) -> None:
        """Twice the rows (row 0 stays the zero row)."""
        old = self.output.shape[0]
        self.output = torch.cat([self.output, torch.zeros_like(self.output)])
        self.prompt = torch.cat([self.prompt, torch.zeros_like(self.prompt)])
        self._free = list(range(2 * old - 1, old - 1, -1))  # the lowest first

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

"""Which adapters sit in the device slots, with a CPU cache of loaded adapters behind them.

Both levels are LRU. A step names the adapters of its requests; each gets a device slot (reusing
its own if it still has one, else a free slot, else the least recently used slot of an adapter the
step does not need) and the step's per-token slot index is built. The scheduler never puts more
distinct adapters in a step than there are slots (`--max-loras`), so a slot can always be found.
An adapter missing from the CPU cache is read again from its directory (`LoRARequest.lora_path`).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from flotilla.engine.lora.adapter import LoRAAdapter, load_adapter
from flotilla.engine.lora.layers import module_name_for, wrap_projections
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.lora.slots import current_lora_slots, set_lora_segments
from flotilla.engine.scheduler import SchedulerOutput
from flotilla.kernels.dispatch import lora_step_segments

logger = logging.getLogger(__name__)


class LoRAManager:
    """Wraps the model's projections and keeps the device slots and the CPU cache."""

    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, max_cpu_loras: int) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self.layers = wrap_projections(model, max_loras, max_rank)
        self.layouts = {name: layer.layout for name, layer in self.layers.items()}
        first = next(iter(self.layers.values()))
        self.dtype = first.lora_a.dtype
        self.device = first.lora_a.device
        self._slots: OrderedDict[int, int] = OrderedDict()  # adapter id -> device slot, least recent first
        self._free_slots = list(range(max_loras))
        self._cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()  # adapter id -> matrices, least recent first
        self.num_slot_loads = 0  # adapters copied into a device slot, for tests and logs
        # Group the step's tokens by slot once per forward, inside it, so that a graph captures it too.
        # The hook holds the slot count, not the manager: a bound method would make a reference cycle
        # (model -> hook -> manager -> model) that keeps the model, and its engine's KV cache, on the
        # device after the engine is dropped, until a garbage collection (H200, 2026-12-03: the next
        # engine of the same process found no memory for its KV cache).
        model.register_forward_pre_hook(functools.partial(_group_tokens, max_loras))

    def add(self, lora: LoRARequest) -> LoRAAdapter:
        """Read an adapter into the CPU cache (checking it against the model); raises LoRAAdapterError."""
        cached = self._cpu.get(lora.lora_int_id)
        if cached is not None:
            self._cpu.move_to_end(lora.lora_int_id)
            return cached
        adapter = load_adapter(
            Path(lora.lora_path), self.layouts, lambda m: module_name_for(self.model, m), self.max_rank, self.dtype
        )
        self._cpu[lora.lora_int_id] = adapter
        while len(self._cpu) > self.max_cpu_loras:
            evicted, _ = self._cpu.popitem(last=False)
            logger.info("LoRA CPU cache: evicted adapter id %d", evicted)
        return adapter

    def remove(self, lora_int_id: int) -> None:
        """Forget an adapter: its CPU copy and its device slot."""
        self._cpu.pop(lora_int_id, None)
        slot = self._slots.pop(lora_int_id, None)
        if slot is not None:
            self._free_slots.append(slot)

    def slot_values(self, out: SchedulerOutput) -> list[int] | None:
        """Each of the step's tokens' device slot (-1: base model), or None if no token uses an
        adapter; loads the step's adapters into slots first."""
        loras = [s.request.lora_request for s in out.scheduled]
        needed = {lora.lora_int_id: lora for lora in loras if lora is not None}
        if not needed:
            return None
        if len(needed) > self.max_loras:
            raise RuntimeError(f"a step names {len(needed)} adapters; --max-loras is {self.max_loras}")
        slot_of = {lora_id: self._slot(lora, needed) for lora_id, lora in needed.items()}
        values: list[int] = []
        for s, lora in zip(out.scheduled, loras, strict=True):
            values += [slot_of[lora.lora_int_id] if lora is not None else -1] * s.num_new_tokens
        return values

    def _slot(self, lora: LoRARequest, needed: dict[int, LoRARequest]) -> int:
        slot = self._slots.get(lora.lora_int_id)
        if slot is not None:
            self._slots.move_to_end(lora.lora_int_id)
            return slot
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            victim = next(i for i in self._slots if i not in needed)
            slot = self._slots.pop(victim)
        adapter = self.add(lora)
        for name, layer in self.layers.items():
            layer.set_slot(slot, adapter.weights.get(name))
        self._slots[lora.lora_int_id] = slot
        self.num_slot_loads += 1
        return slot


def _group_tokens(num_slots: int, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """Forward pre-hook: the step's tokens grouped by slot (`lora_step_segments`), when it uses adapters."""
    slots = current_lora_slots()
    if slots is not None:
        set_lora_segments(slots, lora_step_segments(slots, num_slots))

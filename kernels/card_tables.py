"""Measured launch tables per card: a table chosen on one GPU model is not the best on another (session 25: the int4
wide GEMV's o_proj tile from an H100 cost 59.6 us a batch-1 step on an H200), so the tables the kernels measured are
kept per device name, as vLLM keys its tuned kernel configs, with one entry for every other card.

A table here is what `launch_knobs.KnobSyntax.table` parses: `{(n, k) or None: {knob: int}}` (a weight shape's
knobs, or every shape's). Each module keeps `{DEFAULT: ..., "NVIDIA H200": ...}`; `DEFAULT` is the card the table was
measured on before there were several (an H100 for all of them) and serves every card without an entry of its own.

The card is looked up once per device (`card_name`, cached like `triton_utils.num_sms`), never per launch: a launch's
choice stays a function of shapes and that name, so decode steps stay CUDA-graph capturable. Tensors off CUDA (the
interpreter tests) get `DEFAULT`'s tables, so CPU behaviour does not depend on the machine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from flotilla.kernels.launch_knobs import Table

DEFAULT = "default"
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
T = TypeVar("T")


@functools.cache
def card_name(device_index: int) -> str:
    """The device's name as CUDA reports it ("NVIDIA H200", "NVIDIA H100 80GB HBM3"): the per-card tables' key."""
    return torch.cuda.get_device_name(device_index)


def device_card(tensor: torch.Tensor) -> str | None:
    """The card of the tensor's device; None off CUDA (every table's `DEFAULT` entry)."""
    if tensor.is_cuda:
        return card_name(tensor.device.index if tensor.device.index is not None else torch.cuda.current_device())
    return None


def for_card(tables: Mapping[str, T], card: str | None) -> T:
    """The card's entry of a per-card mapping, else its `DEFAULT` entry."""
    return tables[card] if card is not None and card in tables else tables[DEFAULT]


def shape_knobs(table: Table, n: int, k: int) -> dict[str, int]:
    """The knobs a table gives an `[n, k]` weight: every shape's entry, overlaid by the shape's own."""
    return table.get(None, {}) | table.get((n, k), {})


def parsed(specs: Mapping[str, str], parse: Callable[[str], Table]) -> dict[str, Table]:
    """Per-card table strings (each module's own syntax) parsed by `parse`."""
    return {card: parse(spec) for card, spec in specs.items()}


__all__ = ["DEFAULT", "H100", "H200", "Table", "card_name", "device_card", "for_card", "parsed", "shape_knobs"]

"""Programmatic dependent launch (PDL, Hopper's griddepcontrol) through the batch-1 decode chain.

At batch 1 a Llama layer is ~10 kernels in a row (RMSNorm, qkv GEMV, rotary + KV write, attention, merge,
o_proj GEMV, RMSNorm, gate_up, SiLU-and-mul, down GEMV), each waiting for the previous one to finish before its
first instruction runs: a launch gap, then a ramp of the first loads, per kernel. With PDL a kernel launched with
the `launch_pdl` attribute may start while its predecessor still runs, once every program of the predecessor has
executed `gdc_launch_dependents` (or exited); it must execute `gdc_wait` (all of the predecessor's work done
and its memory visible) before it reads anything the predecessor wrote. What runs before the wait overlaps the
predecessor's tail: here the GEMV's first weight tile (weights are never written by a kernel of the step), so the
next projection's stream starts while the small kernel ahead of it runs.

The rule that keeps this correct: every kernel launched with PDL executes `gdc_wait` in every program before any
read of an activation and before any store (so each PDL kernel completes only after its predecessor, and the
order of the stream holds transitively); the kernels without the wait (split-K reduce, the LoRA-epilogue GEMV,
cuBLAS, the attention) are launched plainly and wait for everything ahead as before.

On by default (`FLOTILLA_PDL=0` in the environment, read at import, turns it off; measured on the H200 in
session 10, calls 4 and 6: batch 1 4.637 -> 4.496 and 4.638 -> 4.489 ms, greedy tokens identical), on CUDA devices of
compute capability 9.0 or later, never under the Triton interpreter (it has no griddepcontrol).
`FLOTILLA_PDL_L2_MB` (default 0, off; only with PDL): each PDL GEMV also asks L2 for the first part of its
weight (at most that many MB of it, `cp.async.bulk.prefetch.L2`) before its wait, so that HBM streams weights
while the small kernels ahead of it run and the loads after the wait hit L2; a one-row projection that cuBLAS
runs (bf16 gate_up, the LM head) gets the same from a small PDL kernel launched ahead of it
(`triton_l2_prefetch.py`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from flotilla.kernels.switches import env_flag
from flotilla.kernels.triton_utils import INTERPRETING

PDL_ENABLED = env_flag("FLOTILLA_PDL", True)
L2_PREFETCH_MB = float(os.environ.get("FLOTILLA_PDL_L2_MB", "0").strip() or 0)

_CAPABLE: dict[int, bool] = {}


def pdl_capable(tensor: torch.Tensor) -> bool:
    """Whether a kernel on `tensor`'s device can be launched by PDL: CUDA, compute capability >= 9.0, compiled
    (not the interpreter). Cached per device: the call sits on every decode launch."""
    if not tensor.is_cuda or INTERPRETING:
        return False
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    ok = _CAPABLE.get(index)
    if ok is None:
        ok = _CAPABLE[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    return ok


def pdl_active(tensor: torch.Tensor) -> bool:
    """Whether a decode-chain kernel whose activations are `tensor` (rows first) launches by PDL: FLOTILLA_PDL not 0,
    a capable device, and one row. Only the one-row chain: on the H200 (session 10, call 4) PDL took batch 1 from
    4.637 to 4.496 ms, but batch 64 from 5.706 to 5.879 (the norm launched early waits on SMs the skinny GEMM's
    tail needs)."""
    return PDL_ENABLED and tensor.dim() > 0 and tensor.shape[0] == 1 and pdl_capable(tensor)


def pdl_launch_options(tensor: torch.Tensor) -> dict[str, bool]:
    """The launch keywords of a kernel with a `PDL` constexpr (wait, and let dependents start, at its top when
    true): `{"PDL": True, "launch_pdl": True}` where `pdl_active`, else none (the plain kernel and launch)."""
    return {"PDL": True, "launch_pdl": True} if pdl_active(tensor) else {}


def peeled_pdl_options(gdc: bool) -> dict[str, Any]:
    """The launch keywords of a GEMV launched by PDL that loads its first weight tile before the wait (its `PDL` and
    `PDL_GDC` constexprs). `gdc=False` (tests only) keeps the peeled first step but drops the griddepcontrol
    instructions and the PDL launch attribute, so that the interpreter, which has neither, can run it."""
    return {"PDL": True, "PDL_GDC": gdc} | ({"launch_pdl": True} if gdc else {})


__all__ = ["L2_PREFETCH_MB", "PDL_ENABLED", "pdl_active", "pdl_capable", "pdl_launch_options", "peeled_pdl_options"]

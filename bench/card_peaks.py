"""The GPU's measured peaks: device-to-device copy bandwidth and bf16 GEMM throughput, measured once a process.

    python bench/card_peaks.py            # prints the JSON of `H200` and of this card

The rooflines and bounds of bench/latency.py, bench/throughput.py, bench/quant_gpu.py and bench/decode_ab.py are
stated against `H200`, the H200's measured peaks (FACTS: a 1 GiB copy at 4.28 TB/s, read + write counted; bf16
GEMM ~790 TFLOP/s), and the issues' floors quote those figures. The device lends an H100 most of the time, whose
HBM3 copies at ~3.3 TB/s: there a figure against `H200` is against the wrong card. `measured()` gives the peaks
of the card this process runs on, measured the way the H200's copy figure was (bench/kernels.py's
`copy_bandwidth`: a 1 GiB bf16 device-to-device copy) and with a large square bf16 matmul, each the best of
several timings, so that a script reports its figure against both. Without CUDA it measures nothing (None).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable

import torch

COPY_ELEMENTS = 2**29  # 1 GiB of bf16, as bench/kernels.py's copy bandwidth
GEMM_N = 8192  # an 8,192^3 bf16 matmul: 1.1 TFLOP, ~1.4 ms at 790 TFLOP/s
TIMINGS = 10  # the best of this many timings, each of CALLS back-to-back calls between two CUDA events
CALLS = 4


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A card's peaks: bytes/s of a device-to-device copy (bytes read + written) and FLOP/s of a bf16 GEMM."""

    copy_bytes_per_s: float
    bf16_flops_per_s: float
    device: str

    def to_json(self) -> dict:
        """The peaks, with the copy in TB/s and the GEMM in TFLOP/s beside them (as the docs quote them)."""
        return {**dataclasses.asdict(self), "copy_tb_per_s": self.copy_bytes_per_s / 1e12,
                "bf16_tflops": self.bf16_flops_per_s / 1e12}  # fmt: skip


H200 = Peaks(4.28e12, 790e12, "NVIDIA H200 (FACTS.md: the reference every issue's floor is stated against)")


def _best_ms(fn: Callable[[], object]) -> float:
    """ms of one call of `fn`: the fastest of TIMINGS timings of CALLS back-to-back calls (after a warm-up that
    lets the clocks ramp up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(TIMINGS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return min(times)


def copy_bytes_per_s() -> float:
    """Bytes read + written per second by a 1 GiB bf16 device-to-device copy."""
    src = torch.randn(COPY_ELEMENTS, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = _best_ms(lambda: dst.copy_(src))
    return 2 * src.nbytes / (ms / 1e3)


def bf16_flops_per_s() -> float:
    """FLOP/s of a GEMM_N^3 bf16 matmul (cuBLAS through torch), random operands."""
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    ms = _best_ms(lambda: torch.matmul(a, b, out=out))
    return 2 * GEMM_N**3 / (ms / 1e3)


@functools.cache
def measured() -> Peaks | None:
    """This card's peaks, measured on the first call (~1 s) and kept for the process; None without CUDA. Call it
    before an engine starts: the buffers (~2.4 GiB) are freed and returned to the driver, so the engine's memory
    profile does not see them."""
    if not torch.cuda.is_available():
        return None
    peaks = Peaks(copy_bytes_per_s(), bf16_flops_per_s(), torch.cuda.get_device_name())
    torch.cuda.empty_cache()
    return peaks


def peaks_json(card: Peaks | None, skipped: str = "no CUDA device") -> dict:
    """The JSON every roofline script records under "peaks": the H200 reference and this card (or why not)."""
    return {"h200": H200.to_json(), "card": card.to_json() if card else {"skipped": skipped}}


def ratio(value: float | None, bound: float | None) -> float | None:
    """`value / bound`, None where either is (no CUDA: no card's bound)."""
    return None if value is None or bound is None else value / bound


if __name__ == "__main__":
    print(json.dumps(peaks_json(measured()), indent=2))

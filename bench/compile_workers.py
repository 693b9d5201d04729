"""Compile a benchmark's Triton variants in parallel before it times them.

A sweep of kernel configurations spends most of its wall time in Triton's compiler, one variant after another.
The script runs itself again in child processes, each with its own arguments plus `--workers 0 --compile-part
i/n`: each child compiles (and runs once) its share of the rows into Triton's on-disk cache and exits, so the
timing process then finds every variant compiled.
"""

from __future__ import annotations

import subprocess
import sys
import time


def compile_in_workers(script: str, workers: int) -> None:
    """Run `script` with this process's arguments in `workers` children (`--compile-part i/workers`), wait for
    all of them and print how long it took."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, script, *sys.argv[1:], "--workers", "0", "--compile-part",
                               f"{i}/{workers}"]) for i in range(workers)]  # fmt: skip
    for proc in procs:
        proc.wait()
    print(f"compiled in {workers} processes: {time.perf_counter() - t0:.1f} s", flush=True)

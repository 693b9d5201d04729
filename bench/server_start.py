"""What one `flotilla serve` start costs: wall seconds from launch to /health 200, and the CPU seconds (user +
system) the API process, its engine core and their helpers spent by then.

The server is the test suite's kind: a tiny random Llama (2 layers, hidden 64) beside the embedded model's
tokenizer, on CPU, one intra-op thread, structured output's compile processes not warmed at start (the suite's
`start_server` default). CPU seconds are the figure to compare: the wall time moves with the machine's load, the
CPU time much less. Each start is stopped (SIGTERM) before the next.

    .venv/bin/python bench/server_start.py --starts 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.local_server import free_port


def build_tiny_llama(path: Path) -> None:
    """A tiny random fp32 Llama in `path`, with the embedded model's tokenizer (as the tests' tiny models)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from flotilla.engine.embedded_model import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(1000)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path, max_shard_size="2MB")
    tokenizer.save_pretrained(path)


def cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds so far of the process `pid` ("api") and of each of its descendants (by process name)."""
    root = psutil.Process(pid)
    cpu: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            name = "api" if process.pid == pid else _role(process)
            cpu[name] = cpu.get(name, 0.0) + times.user + times.system
    return cpu


def _role(process: psutil.Process) -> str:
    """A descendant's role, from its command line: the engine core, multiprocessing's resource tracker, or other."""
    cmdline = " ".join(process.cmdline())
    if "resource_tracker" in cmdline:
        return "tracker"
    return "core" if "spawn_main" in cmdline else process.name()


def one_start(model: Path, flags: list[str], log: Path) -> tuple[float, dict[str, float]]:
    """Start the server, wait for /health 200, read the tree's CPU, stop it: (wall seconds, CPU by process)."""
    port = free_port()
    cmd = [sys.executable, "-m", "flotilla.engine.server", str(model), "--port", str(port), "--host", "127.0.0.1",
           "--uvicorn-log-level", "warning", "--structured-outputs-config", '{"warm_up": false}', *flags]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        while process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        wall = time.monotonic() - start
        return wall, cpu_by_process(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    """Start the server --starts times; print each start and the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--model", type=Path, help="serve this model instead of a freshly built tiny Llama")
    parser.add_argument("flags", nargs="*", help="more `flotilla serve` flags (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="server-start-") as tmp:
        model = args.model or Path(tmp) / "tiny-llama"
        if args.model is None:
            build_tiny_llama(model)
        walls, totals, by_name = [], [], {}
        for i in range(args.starts):
            wall, cpu = one_start(model, args.flags, Path(tmp) / f"server-{i}.log")
            walls.append(wall)
            totals.append(sum(cpu.values()))
            for name, seconds in cpu.items():
                by_name.setdefault(name, []).append(seconds)
            parts = " ".join(f"{name} {seconds:.2f}" for name, seconds in cpu.items())
            print(f"start {i}: wall {wall:.2f} s, cpu {totals[-1]:.2f} s ({parts})", flush=True)
    medians = " ".join(f"{name} {statistics.median(values):.2f}" for name, values in by_name.items())
    print(f"median of {args.starts}: wall {statistics.median(walls):.2f} s, cpu {statistics.median(totals):.2f} s "
          f"({medians}); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

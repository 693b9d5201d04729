"""The HTTP path against the offline engine on a model whose step is nearly free, so that the server's
per-token host work (output hand-off, detokenization, SSE, the event loop) is what the figures show.

    python bench/http_proxy.py --num-prompts 512 --concurrency 256 --input-len 128 --output-len 64 \
        --json bench/results/http-proxy-cpu.json

Both sides run the `tiny-llama` shape of bench/model_dirs.py (hidden 128, 2 layers, a 1,024-token
word-level tokenizer) with random weights: `bench/throughput.py` offline, then `bench/serve.py
--launch` against a real `flotilla serve` subprocess with the same engine flags. The ratio of output
tok/s is the fraction of the engine that survives the server. A profile of the server (`--profile`)
runs it under cProfile and writes the top functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from model_dirs import make_model_dir
from report import report

HERE = Path(__file__).resolve().parent


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Run a benchmark that writes --json to a temporary file; return what it wrote."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        proc = subprocess.run([*cmd, "--json", f.name], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{shlex.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        return json.loads(Path(f.name).read_text())


def main() -> None:
    """Run both sides and report output tok/s, the ratio and the server's latencies."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--clients", type=int, default=1, help="bench/serve.py client processes")
    p.add_argument("--skip-offline", action="store_true", help="only the HTTP side")
    p.add_argument("--profile", default=None, help="cProfile the server; write its stats text here")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    model = str(make_model_dir("tiny-llama", tempfile.mkdtemp(prefix="tiny-llama")))
    # The same engine settings on both sides (bench/throughput.py sizes max_model_len this way).
    max_model_len = -(-(a.input_len + a.output_len) // 16) * 16 + 16
    engine = ["--load-format", "dummy", "--max-num-seqs", str(a.concurrency)]
    result: dict = {"command": "python bench/http_proxy.py " + shlex.join(sys.argv[1:])}
    if not a.skip_offline:
        offline = run_json([sys.executable, str(HERE / "throughput.py"), "--model", model, *engine,
                            "--num-prompts", str(a.num_prompts), "--input-len", str(a.input_len),
                            "--output-len", str(a.output_len)])
        result["offline_output_tok_s"] = offline["flotilla"]["output_tokens_per_s"]
    serve_args = [*engine, "--max-model-len", str(max_model_len), "--disable-log-stats"]
    prof = tempfile.mktemp(suffix=".prof")
    python_args = ["--server-python-args", f"-m cProfile -o {prof}"] if a.profile else []
    http = run_json([sys.executable, str(HERE / "serve.py"), "--launch", "--model", model,
                     "--serve-args", shlex.join(serve_args), "--num-prompts", str(a.num_prompts),
                     "--max-concurrency", str(a.concurrency), "--input-len", str(a.input_len),
                     "--output-len", str(a.output_len), "--vocab-size", "1024", "--clients", str(a.clients),
                     *python_args])
    result["http"] = {k: v for k, v in http.items() if k != "command"}
    result["http_output_tok_s"] = http["output_throughput"]
    if "offline_output_tok_s" in result:
        result["http_over_offline"] = result["http_output_tok_s"] / result["offline_output_tok_s"]
    if a.profile:
        write_profile(prof, a.profile)
    report(result, a.json)


def write_profile(prof: str, path: str) -> None:
    """The event-loop thread's top functions (cProfile sees only the thread it started on)."""
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    Path(path).write_text(out.getvalue())


if __name__ == "__main__":
    main()

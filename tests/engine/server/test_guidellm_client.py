"""guidellm, a maintained benchmark client vLLM users run, drives the server in a short smoke run
(issue 24): 4 concurrent streams of synthetic 32-token prompts, 8 requests, all successful."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import API_KEY


def test_guidellm_concurrent_smoke_run(server, tiny_model_dirs, tmp_path):
    report = tmp_path / "guidellm.json"
    guidellm = Path(sys.executable).parent / "guidellm"
    cmd = [str(guidellm), "run",
           "--backend", f"kind=openai_http,target={server.url},model=tiny,api_key={API_KEY}",
           "--profile", "kind=concurrent,streams=4",
           "--constraint", "kind=max_requests,count=8",
           "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=8",
           "--tokenizer", f"kind=huggingface_auto,model={tiny_model_dirs['llama']}",
           "--output", f"kind=json,path={report}",
           "--disable-console-interactive"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         # One worker process (each one imports torch) is enough for 4 streams.
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    state = json.loads(report.read_text())["benchmarks"][0]["scheduler_state"]
    assert (state["successful_requests"], state["errored_requests"]) == (8, 0)

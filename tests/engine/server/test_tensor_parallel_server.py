"""`flotilla serve --device cpu -tp 2` answers the real `openai` client with the tokens of `-tp 1`, and
a killed worker makes the server exit non-zero within seconds (so Kubernetes restarts the pod)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .conftest import API_KEY, Server, start_tiny_server, stop_server

PROMPT = "The harbour at dawn"


def _workers(server_pid: int) -> list[int]:
    """The server's tp worker processes: spawned by its engine-core process (itself the server's spawn child),
    or by the server itself when the engine runs on a thread (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    children = _spawn_children(server_pid)
    grandchildren = [pid for child in children for pid in _spawn_children(child)]
    return grandchildren or children


def _spawn_children(parent_pid: int) -> list[int]:
    """`parent_pid`'s child processes started by multiprocessing's spawn."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent_pid and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def tp_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("tp-server") / "server.log"
    server = start_tiny_server(tiny_model_dirs["llama"], log, "--device", "cpu", "-tp", "2")
    yield server
    stop_server(server)


def test_openai_client_gets_the_single_rank_tokens_then_a_dead_worker_exits_the_server(tp_server, tiny_model_dirs):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tp_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    single = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8)
    expected = single.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert answer.choices[0].text == expected[0].outputs[0].text
    assert answer.usage.completion_tokens == 8

    workers = _workers(tp_server.process.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while tp_server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tp_server.process.returncode not in (None, 0), "the server kept running without a worker"
    log = tp_server.log.read_text()
    assert "exited with code -9" in log, log[-2000:]

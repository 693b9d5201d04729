"""A real `flotilla serve` process on a free loopback port, shared by the server tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

API_KEY = "test-key-0123456789"


def tiny_llama_with_markers(embedded_model_dir: Path, path: Path, markers: Sequence[str], seed: int) -> Any:
    """Save into `path` a tiny random Llama with the embedded model's tokenizer plus `markers` as added tokens (not
    special: they stay in the text, as Qwen3's `<think>` and `<tool_call>`); return that tokenizer, for the markers'
    ids. The reasoning and tool-call server tests steer such a model with logit_bias."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    tokenizer.add_tokens([AddedToken(m, special=False) for m in markers])
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer


def streamed_reasoning_and_content(stream: Any, n: int) -> tuple[list[str], list[str]]:
    """The reasoning and the content each of a streamed chat completion's `n` choices sent, joined."""
    reasoning, content = [""] * n, [""] * n
    for chunk in stream:
        for choice in chunk.choices:
            reasoning[choice.index] += choice.delta.model_extra.get("reasoning") or ""
            content[choice.index] += choice.delta.content or ""
    return reasoning, content


@dataclass
class Server:
    """A running server: where it listens and how to reach it."""

    process: subprocess.Popen
    port: int
    log: Path
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of /metrics: `name{labels}` -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def metric(self, name: str) -> float:
        """Sum of a metric over its label sets."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its descendants so far: the API process, its engine core and
    their helpers (e.g. the chat-template fork server and its render children)."""
    return sum(_cpu_by_process(pid).values())


def _cpu_by_process(pid: int) -> dict[tuple[int, float], float]:
    import psutil

    root = psutil.Process(pid)
    cpu = {}
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            cpu[process.pid, process.create_time()] = times.user + times.system
    return cpu


def wait_until_idle(pid: int, deadline_s: float = 60, window_s: float = 1.0, idle_cpu_s: float = 0.1) -> bool:
    """Wait until a process tree spends less than `idle_cpu_s` CPU seconds in `window_s` of wall time; False if it
    is still busy after `deadline_s`. CPU time, not wall time: a loaded machine slows a busy tree's work but does not
    make an idle one busy (an idle server here spends ~0 CPU s). A wait, not a timing assertion."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        before = _cpu_by_process(pid)
        time.sleep(window_s)
        after = _cpu_by_process(pid)
        # Per process present at the end (one that ended in between drops out instead of counting negative).
        if sum(cpu - before.get(key, 0.0) for key, cpu in after.items()) < idle_cpu_s:
            return True
    return False


def wait_until_engine_idle(server: Server, deadline_s: float = 120) -> None:
    """Wait until no request is running or waiting and no KV block is held (a wait, not a timing assertion): the
    shared servers carry whatever an earlier test left, e.g. a stream whose client left and whose abort has not
    landed yet, which would move the counters a test compares before and after."""
    deadline = time.monotonic() + deadline_s
    while (server.metric("vllm:num_requests_running") + server.metric("vllm:num_requests_waiting")
           + server.metric("vllm:kv_cache_usage_perc")):
        assert time.monotonic() < deadline, "requests stayed in the engine"
        time.sleep(0.1)


def prefix_cache_hits_of(server: Server, send: Callable[[], object], deadline_s: float = 60) -> float:
    """Prefix-cache tokens `send()` (one request) found, from /metrics. The engine publishes its counts after a step
    or call and every half second when idle, so they are read once still for a second (an earlier request's look-up
    published late would count as this one's), and again once this request's look-up is in
    (`vllm:prefix_cache_queries_total` grew)."""
    def counts() -> tuple[float, float]:
        return server.metric("vllm:prefix_cache_queries_total"), server.metric("vllm:prefix_cache_hits_total")

    deadline = time.monotonic() + deadline_s
    before = counts()
    while True:
        time.sleep(1.0)
        if (now := counts()) == before:
            break
        assert time.monotonic() < deadline, "the prefix-cache counts never settled"
        before = now
    send()
    while (after := counts())[0] == before[0]:
        assert time.monotonic() < deadline, "the request's prefix-cache look-up never reached /metrics"
        time.sleep(0.05)
    return after[1] - before[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# uvicorn's words when the port it was given is taken.
_PORT_TAKEN = "address already in use"


def start_server(model: Path, log: Path, *flags: str, env: dict[str, str] | None = None,
                 launcher: Sequence[str] = (sys.executable, "-m", "flotilla.engine.server"),
                 address: Callable[[], tuple[str, int]] | None = None, warm_grammars: bool = False) -> Server:
    """Start the server (`python -m flotilla.engine.server`, or `launcher` taking the same arguments)
    and wait until /health answers 200. It listens on what `address()` gives (default: 127.0.0.1 and a free port).

    Unless `flags` set --structured-outputs-config or `warm_grammars` is true, the server starts structured
    output's compile processes on its first constrained request, not at start (`{"warm_up": false}`): most
    servers here never constrain output, and the warm-up cost each start ~3 s of CPU and ~0.5 GiB while it
    competed with the test on CI's 2 cores. The session's shared servers keep the default (warm), as does any
    server started with its own structured-output settings.

    The free port is closed again before the server binds it: another process (or a client's outgoing
    connection, which takes its local port from the same range) may take it in between. The server then exits
    at its bind, and is started again on another address."""
    if not warm_grammars and not any(flag.startswith("--structured-outputs-config") for flag in flags):
        flags = (*flags, "--structured-outputs-config", '{"warm_up": false}')
    for _ in range(3):
        server = _start_server_once(model, log, flags, env, launcher, address or (lambda: ("127.0.0.1", free_port())))
        if server is not None:
            return server
    raise RuntimeError(f"three free ports were taken before the server bound them:\n{log.read_text()[-3000:]}")


def _start_server_once(model: Path, log: Path, flags: Sequence[str], env: dict[str, str] | None,
                       launcher: Sequence[str], address: Callable[[], tuple[str, int]]) -> Server | None:
    """The server started and healthy, or None when its port was taken before it bound it."""
    host, port = address()
    cmd = [
        *launcher,
        str(model),
        "--port",
        str(port),
        "--host",
        host,
        "--uvicorn-log-level",
        "warning",
        *flags,
    ]
    handle = log.open("w")
    process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(process, port, log, host)
    # A wait, not an assertion (a crashed server is caught at once by poll()): the API process and its
    # engine-core process each import torch, and on the shared 2-core CI machine under load a start
    # has taken over 180 s.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if _PORT_TAKEN in log.read_text():
                return None
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-3000:]}")


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()


def start_tiny_server(model: Path, log: Path, *flags: str, env: dict[str, str] | None = None,
                      warm_grammars: bool = False) -> Server:
    """The tiny Llama served as `tiny` and `tiny-alias`, API key required, 256-token context, plus `flags`
    (and `env` for the server's process; `warm_grammars` as `start_server`'s)."""
    return start_server(
        model,
        log,
        "--served-model-name",
        "tiny",
        "tiny-alias",
        "--max-model-len",
        "256",
        "--block-size",
        "8",
        "--disable-log-stats",
        *flags,
        env={"VLLM_API_KEY": API_KEY, **(env or {})},
        warm_grammars=warm_grammars,
    )


@pytest.fixture(scope="session")
def server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    """The shared server (`start_tiny_server`, no extra flags: structured output warmed at start, the default)."""
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("server") / "server.log",
                          warm_grammars=True)
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def tool_server(embedded_model_dir, tmp_path_factory) -> Iterator[Server]:
    """The embedded model served as `x` with the hermes tool parser (auto tool choice on), the
    X-Request-Id response header, cached-token usage details and compact JSON grammars (shared by the
    structured-output and Responses-tools tests)."""
    s = start_server(embedded_model_dir, tmp_path_factory.mktemp("tool-server") / "server.log",
                     "--max-model-len", "512", "--disable-log-stats", "--served-model-name", "x",
                     "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-request-id-headers",
                     "--enable-prompt-tokens-details",
                     # Compact JSON for every grammar, tool calls' included (vLLM's flag): xgrammar's
                     # default lets whitespace run free between tokens and the small model at temperature
                     # 0 falls into a newline run to max_tokens ('mixed', a named tool call, 2026-12-03).
                     "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
                     env={"VLLM_API_KEY": API_KEY})
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def pooling_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    """The tiny Qwen3 as `start_tiny_server` serves it with `--runner pooling` (shared by the embeddings, /score and
    /rerank, /pooling and /invocations tests: one start per run, not one per module). Its tests leave nothing that
    another reads as an absolute: prefix-cache hits and CPU time are compared before and after, and a test that
    stops or drains a pooling server starts its own."""
    s = start_tiny_server(tiny_model_dirs["qwen3"], tmp_path_factory.mktemp("pooling-server") / "server.log",
                          "--runner", "pooling")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def sleep_mode_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    """The tiny server in dev mode with --enable-sleep-mode, its engine core in a process of its own (shared by the
    sleep modes' and the sleep routes' tests: one start per run). Each of their tests leaves it awake and idle, and
    counters are compared before and after."""
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("sleep-mode") / "server.log",
                          "--enable-sleep-mode",
                          env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def flags_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    """The tiny Llama served as `tiny` with flags whose tests share one start (a start cost CI ~10 s), none of them
    changing what another's tests read: vLLM's human-readable --max-model-len 0.4k and --max-num-batched-tokens 1K
    with --load-format safetensors (test_vllm_flag_forms.py); uvicorn's access lines at INFO, some paths left out
    (test_access_log.py; start_server's --uvicorn-log-level warning is overridden: the later flag wins); usage in
    every stream (--enable-force-include-usage, test_force_include_usage.py); request templates trusted and given
    message content as a string (--chat-template-content-format string: plain-string messages, all the others
    send, render as before; test_vllm_compat.py)."""
    s = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("flags-server") / "server.log",
                     "--served-model-name", "tiny", "--max-model-len", "0.4k", "--max-num-batched-tokens", "1K",
                     "--load-format", "safetensors", "--disable-log-stats",
                     "--uvicorn-log-level", "info", "--disable-access-log-for-endpoints", " /health, /metrics,",
                     "--enable-force-include-usage",
                     "--trust-request-chat-template", "--chat-template-content-format", "string",
                     env={"VLLM_API_KEY": API_KEY})
    yield s
    stop_server(s)


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def async_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)

"""A fault inside the engine, over HTTP. A fault attributable to one request fails that request alone
(a 500 with OpenAI's error JSON, or a final error event in its stream) and the server keeps serving
with no KV block leaked. If the step loop itself dies (an error no single request accounts for, e.g. a
device fault), the process exits non-zero at once, logging the traceback, instead of lingering with
/health 503.

The faults are injected by a wrapper script that patches `LLMEngine` inside the server's own process
before starting the real `flotilla serve` entry point: a test-only hook, not part of the product."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from flotilla.engine.config import ServerConfig

from .conftest import API_KEY, Server, start_server

FAULTY_SERVER = '''
import sys
from flotilla.engine.llm_engine import LLMEngine
step, process_token = LLMEngine.step, LLMEngine._process_token

def faulty_step(self):
    if any(r.prompt == "inject a device fault" for r in self.scheduler.requests.values()):
        raise RuntimeError("injected device fault")
    return step(self)

def faulty_process_token(self, child, result):
    if child.prompt == "inject a request fault" and child.num_output_tokens >= 2:
        raise RuntimeError("injected request fault")
    return process_token(self, child, result)

# At module level, so that the engine-core process (spawned: it imports this script as __mp_main__)
# runs the patched engine too.
LLMEngine.step, LLMEngine._process_token = faulty_step, faulty_process_token
if __name__ == "__main__":
    from flotilla.engine.server.cli import main
    sys.exit(main(sys.argv[1:]))
'''
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def complete(server: Server, prompt: str, **extra: object) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 6, "min_tokens": 6, **extra}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60)


@pytest.fixture(scope="module")
def faulty_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("faulty")
    script = root / "faulty_server.py"
    script.write_text(FAULTY_SERVER)
    server = start_server(tiny_model_dirs["llama"], root / "server.log", "--max-model-len", "128",
                          "--disable-log-stats", "--api-key", API_KEY, launcher=(sys.executable, str(script)),
                          env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})  # the engine core's own process
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def test_a_fault_in_one_request_fails_that_request_alone(faulty_server):
    failed = complete(faulty_server, "inject a request fault")
    assert failed.status_code == 500, failed.text
    assert "injected request fault" in failed.json()["error"]["message"]
    stream = complete(faulty_server, "inject a request fault", stream=True)
    events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "injected request fault" in json.loads(events[-2])["error"]["message"]
    assert httpx.get(f"{faulty_server.url}/health", timeout=10).status_code == 200
    served = complete(faulty_server, "Hello")
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 6
    deadline = time.monotonic() + 60  # the gauge follows the engine's idle snapshots
    while faulty_server.metric("vllm:kv_cache_usage_perc") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert faulty_server.metric("vllm:kv_cache_usage_perc") == 0.0


def test_a_dead_engine_loop_exits_the_process_non_zero(faulty_server):
    assert complete(faulty_server, "Hello").status_code == 200
    try:
        response = complete(faulty_server, "inject a device fault")
        assert response.status_code == 503, response.text  # if the reply beats the exit
    except httpx.HTTPError:
        pass  # or the process is already gone
    started = time.monotonic()
    code = faulty_server.process.wait(timeout=120)  # a wait: a hang fails here
    assert code != 0
    # At once, not after a drain of the default --shutdown-timeout (30 s): half of it is room for a loaded machine.
    assert time.monotonic() - started < ServerConfig().shutdown_timeout / 2
    text = faulty_server.log.read_text()
    assert "Traceback" in text and "injected device fault" in text
    assert "exiting with status 1" in text

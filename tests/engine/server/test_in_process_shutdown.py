"""A server whose engine runs on a thread of its own process (VLLM_ENABLE_V1_MULTIPROCESSING=0) frees the engine's KV
pool when it stops: `AsyncEngine.shutdown` shuts the engine down, as the engine-core process does when it exits.

A wrapper script reports, from inside the server's process, whether `LLMEngine.shutdown` ran and left the pool
unreferenced: a test-only hook around the real `flotilla serve` entry point, not part of the product."""

from __future__ import annotations

import signal
import sys

from .conftest import start_server

REPORTING_SERVER = '''
import sys
import weakref
from flotilla.engine.llm_engine import LLMEngine
shutdown = LLMEngine.shutdown

def reporting_shutdown(self):
    pool = weakref.ref(self.runner.kv_cache)
    shutdown(self)
    print(f"engine shut down; KV pool freed: {pool() is None}", flush=True)

LLMEngine.shutdown = reporting_shutdown
if __name__ == "__main__":
    from flotilla.engine.server.cli import main
    sys.exit(main(sys.argv[1:]))
'''


def test_a_server_stopped_in_process_shuts_its_engine_down_and_frees_the_pool(tiny_model_dirs, tmp_path):
    script = tmp_path / "reporting_server.py"
    script.write_text(REPORTING_SERVER)
    log = tmp_path / "server.log"
    server = start_server(tiny_model_dirs["llama"], log, "--max-model-len", "128", "--disable-log-stats",
                          launcher=(sys.executable, str(script)), env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    try:
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=120) == 0  # a wait: a hang fails here
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    text = log.read_text()
    assert "engine shut down; KV pool freed: True" in text, text[-3000:]
    assert "Traceback" not in text

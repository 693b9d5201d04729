"""vLLM's --ssl-certfile / --ssl-keyfile: the server speaks HTTPS (uvicorn's TLS), the openai client verifies its
certificate; files that cannot be loaded are a usage error at start-up, before the model loads."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from flotilla.engine.server.cli import main

from .conftest import Server, free_port, stop_server


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def _trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def _start_https(model: Path, log: Path, cert: Path, key: Path) -> Server:
    """The server on HTTPS, once /health answers 200 through a client that trusts `cert` alone."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "flotilla.engine.server", str(model), "--port", str(port), "--host", "127.0.0.1",
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--structured-outputs-config", '{"warm_up": false}'],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(process, port, log)
    deadline = time.monotonic() + 300  # a wait, not an assertion: two processes import torch on a loaded machine
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"https://127.0.0.1:{port}/health", verify=_trusting(cert), timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"the HTTPS server did not become healthy:\n{log.read_text()[-3000:]}")


def test_the_server_speaks_https_with_the_given_certificate(tiny_model_dirs, tmp_path, tls_files):
    cert, key = tls_files
    server = _start_https(tiny_model_dirs["llama"], tmp_path / "server.log", cert, key)
    try:
        client = openai.OpenAI(base_url=f"https://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0,
                               timeout=120, http_client=httpx.Client(verify=_trusting(cert)))
        completion = client.completions.create(model=str(tiny_model_dirs["llama"]), prompt="Hello", max_tokens=2)
        assert completion.usage.completion_tokens == 2
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the same port is not served
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
    finally:
        stop_server(server)


@pytest.mark.parametrize(("files", "message"), [
    (lambda cert, key: ["--ssl-keyfile", str(key)], "--ssl-keyfile needs --ssl-certfile"),
    (lambda cert, key: ["--ssl-certfile", str(cert.parent / "absent.pem")],
     "cannot be loaded as a PEM certificate and its private key (No such file or directory)"),
    (lambda cert, key: ["--ssl-certfile", str(cert)], "cannot be loaded as a PEM certificate and its private key"),
    (lambda cert, key: ["--ssl-certfile", str(key), "--ssl-keyfile", str(cert)],
     "cannot be loaded as a PEM certificate and its private key"),
])
def test_tls_files_that_cannot_load_are_a_usage_error(tiny_model_dirs, tls_files, capsys, files, message):
    # uvicorn loads them only when serving starts: a bad file was a traceback after the model had loaded.
    # A budget below the body size is refused after them (a later rule): nothing is ever served by this test.
    assert main([str(tiny_model_dirs["llama"]), *files(*tls_files), "--max-body-bytes-in-flight", "1"]) == 2
    err = capsys.readouterr().err
    assert "flotilla serve: error:" in err and message in err, err

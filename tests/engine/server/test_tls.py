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


@pytest.fixture(scope="module")
def client_files(tmp_path_factory) -> dict[str, Path]:
    """A CA (ca.pem), a client certificate it signed (client.pem, client.key), and a self-signed client certificate
    of no CA the server knows (stranger.pem, stranger.key), made with openssl."""
    folder = tmp_path_factory.mktemp("mtls")
    files = {name: folder / name for name in ("ca.pem", "ca.key", "client.pem", "client.key", "client.csr",
                                              "stranger.pem", "stranger.key")}

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", files["ca.key"], "-out", files["ca.pem"],
            "-days", "1", "-subj", "/CN=test client CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", files["client.key"], "-out", files["client.csr"],
            "-subj", "/CN=client")
    openssl("x509", "-req", "-in", files["client.csr"], "-CA", files["ca.pem"], "-CAkey", files["ca.key"],
            "-CAcreateserial", "-out", files["client.pem"], "-days", "1")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", files["stranger.key"], "-out",
            files["stranger.pem"], "-days", "1", "-subj", "/CN=client")
    return files


def _trusting(cert: Path, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context trusting `cert` alone, showing the `client` certificate and key when given."""
    context = ssl.create_default_context(cafile=str(cert))
    if client is not None:
        context.load_cert_chain(*map(str, client))
    return context


def _start_https(model: Path, log: Path, cert: Path, key: Path, *flags: str,
                 client: tuple[Path, Path] | None = None) -> Server:
    """The server on HTTPS, once /health answers 200 through a client that trusts `cert` alone (showing the
    `client` certificate when given)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "flotilla.engine.server", str(model), "--port", str(port), "--host", "127.0.0.1",
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--structured-outputs-config", '{"warm_up": false}',
         *flags],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(process, port, log)
    verify = _trusting(cert, client)
    deadline = time.monotonic() + 300  # a wait, not an assertion: two processes import torch on a loaded machine
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"https://127.0.0.1:{port}/health", verify=verify, timeout=1).status_code == 200:
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


def test_with_cert_reqs_2_only_a_client_certificate_of_the_ca_is_served(tiny_model_dirs, tmp_path, tls_files,
                                                                         client_files):
    # Mutual TLS (vLLM's --ssl-ca-certs, --ssl-cert-reqs 2 = ssl.CERT_REQUIRED): the start-up wait itself shows the
    # CA's client certificate; without one, or with one the CA did not sign, the handshake refuses the client.
    cert, key = tls_files
    client = (client_files["client.pem"], client_files["client.key"])
    server = _start_https(tiny_model_dirs["llama"], tmp_path / "server.log", cert, key,
                          "--ssl-ca-certs", str(client_files["ca.pem"]), "--ssl-cert-reqs", "2", client=client)
    try:
        url = f"https://127.0.0.1:{server.port}"
        openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120,
                                      http_client=httpx.Client(verify=_trusting(cert, client)))
        completion = openai_client.completions.create(model=str(tiny_model_dirs["llama"]), prompt="Hello",
                                                      max_tokens=2)
        assert completion.usage.completion_tokens == 2
        with pytest.raises(httpx.TransportError):  # no client certificate
            httpx.get(f"{url}/health", verify=_trusting(cert), timeout=30)
        stranger = (client_files["stranger.pem"], client_files["stranger.key"])
        with pytest.raises(httpx.TransportError):  # a certificate the CA did not sign
            httpx.get(f"{url}/health", verify=_trusting(cert, stranger), timeout=30)
        # the server still serves the CA's client afterwards
        assert httpx.get(f"{url}/health", verify=_trusting(cert, client), timeout=30).status_code == 200
    finally:
        stop_server(server)


@pytest.mark.parametrize(("flags", "message"), [
    (lambda cert, key, ca: ["--ssl-ca-certs", str(ca)],
     "--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile (clients show certificates in the TLS handshake"),
    (lambda cert, key, ca: ["--ssl-cert-reqs", "2"], "--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile"),
    (lambda cert, key, ca: ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-cert-reqs", "1"],
     "--ssl-cert-reqs 1 needs --ssl-ca-certs (the CA certificates a client's certificate is checked against"),
    (lambda cert, key, ca: ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-ca-certs", str(key),
                            "--ssl-cert-reqs", "2"], "--ssl-ca-certs {key} cannot be loaded as PEM CA certificates"),
    (lambda cert, key, ca: ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-ca-certs",
                            str(ca.parent / "absent.pem")], "cannot be loaded as PEM CA certificates (No such file"),
])
def test_client_certificate_flags_that_cannot_work_are_a_usage_error(tiny_model_dirs, tls_files, client_files, capsys,
                                                                     flags, message):
    # A budget below the body size is refused after them (a later rule): nothing is ever served by this test.
    cert, key = tls_files
    argv = flags(cert, key, client_files["ca.pem"])
    assert main([str(tiny_model_dirs["llama"]), *argv, "--max-body-bytes-in-flight", "1"]) == 2
    err = capsys.readouterr().err
    assert "flotilla serve: error:" in err and message.format(key=key) in err, err


def test_cert_reqs_outside_pythons_verify_modes_is_refused_by_the_parser(tiny_model_dirs, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(tiny_model_dirs["llama"]), "--ssl-cert-reqs", "3"])
    assert exit_.value.code == 2
    assert "--ssl-cert-reqs: invalid choice: 3 (choose from 0, 1, 2)" in capsys.readouterr().err

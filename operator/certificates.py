"""The webhook's serving certificate, made by the operator itself.

kopf's built-in generator (certbuilder/oscrypto) fails on OpenSSL 3.0, so the certificate is made
with the `openssl` command line: a self-signed EC P-256 certificate that is its own CA (kopf puts
it in the webhook configuration's caBundle). The apiserver checks subjectAltNames only, so every
name and IP the apiserver may dial is a SAN (127.0.0.1 when the operator runs beside a local
apiserver; the Service's DNS names in a cluster).

A certificate already in the directory (e.g. a mounted Secret from cert-manager, as tls.crt and
tls.key) is used as it is.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
VALID_DAYS = 365


def _san(hosts: list[str]) -> str:
    entries = []
    for host in dict.fromkeys(hosts):  # unique, in order
        try:
            ipaddress.ip_address(host)
            entries.append(f"IP:{host}")
        except ValueError:
            entries.append(f"DNS:{host}")
    return ",".join(entries)


def ensure_certificate(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """(certificate, key) files in `directory`, made self-signed for `hosts` when absent."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    if cert.exists() and key.exists():
        return cert, key
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", str(VALID_DAYS), "-subj", f"/CN={hosts[0]}",
         "-addext", f"subjectAltName={_san(hosts)}", "-addext", "extendedKeyUsage=serverAuth"],
        check=True, capture_output=True, text=True)
    key.chmod(0o600)
    return cert, key

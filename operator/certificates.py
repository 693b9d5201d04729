"""The webhook's serving certificate, made by the operator itself.

kopf's built-in generator (certbuilder/oscrypto) fails on OpenSSL 3.0, so the certificate is made
with the `openssl` command line: a self-signed EC P-256 certificate that is its own CA (kopf puts
it in the webhook configuration's caBundle). The apiserver checks subjectAltNames only, so every
name and IP the apiserver may dial is a SAN (127.0.0.1 when the operator runs beside a local
apiserver; the Service's DNS names in a cluster).

A certificate already in the directory (e.g. a mounted Secret from cert-manager, as tls.crt and
tls.key) is used as it is, unless it expires within RENEW_BEFORE_DAYS and the directory is writable
(the operator made it): then a new one is made. `needs_restart` tells the operator when to restart its
webhook server on another certificate (main.py checks it periodically).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
VALID_DAYS = 365
RENEW_BEFORE_DAYS = 30
DAY_S = 86_400


def _san(hosts: list[str]) -> str:
    entries = []
    for host in dict.fromkeys(hosts):  # unique, in order
        try:
            ipaddress.ip_address(host)
            entries.append(f"IP:{host}")
        except ValueError:
            entries.append(f"DNS:{host}")
    return ",".join(entries)


def expires_within(cert: Path, seconds: float) -> bool:
    """Whether the certificate expires within `seconds` (openssl x509 -checkend)."""
    done = subprocess.run(["openssl", "x509", "-checkend", str(int(seconds)), "-noout", "-in", str(cert)],
                          capture_output=True, text=True)
    return done.returncode != 0


def ensure_certificate(directory: Path, hosts: list[str], valid_days: int = VALID_DAYS) -> tuple[Path, Path]:
    """(certificate, key) files in `directory`, made self-signed for `hosts` when absent or due for renewal."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    if cert.exists() and key.exists():
        due = expires_within(cert, RENEW_BEFORE_DAYS * DAY_S)
        if not due or not os.access(directory, os.W_OK):
            return cert, key  # still good, or mounted (its issuer renews it)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", str(valid_days), "-subj", f"/CN={hosts[0]}",
         "-addext", f"subjectAltName={_san(hosts)}", "-addext", "extendedKeyUsage=serverAuth"],
        check=True, capture_output=True, text=True)
    key.chmod(0o600)
    return cert, key


def needs_restart(cert: Path, served: bytes) -> bool:
    """Whether the webhook server should restart on another certificate: the file changed (a mounted
    Secret was rotated by its issuer), or the operator made it and it is due for renewal."""
    try:
        if cert.read_bytes() != served:
            return True
    except OSError:
        return False  # a mounted Secret mid-update: look again next time
    return os.access(cert.parent, os.W_OK) and expires_within(cert, RENEW_BEFORE_DAYS * DAY_S)

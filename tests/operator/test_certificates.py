"""The webhook certificate: made when absent, kept while good, renewed before it expires, rotation noticed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flotilla.operator import certificates
from flotilla.operator.certificates import RENEW_BEFORE_DAYS, ensure_certificate, needs_restart

HOSTS = ["127.0.0.1", "localhost"]


def _not_after(cert: Path) -> str:
    return subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(cert)], capture_output=True,
                          text=True, check=True).stdout


def test_a_certificate_is_made_once_and_kept_while_good(tmp_path):
    cert, key = ensure_certificate(tmp_path, HOSTS)
    first = cert.read_bytes()
    assert ensure_certificate(tmp_path, HOSTS) == (cert, key) and cert.read_bytes() == first
    assert not needs_restart(cert, first)


def test_a_certificate_near_expiry_is_renewed(tmp_path):
    cert, _ = ensure_certificate(tmp_path, HOSTS, valid_days=RENEW_BEFORE_DAYS - 1)
    old, old_end = cert.read_bytes(), _not_after(cert)
    assert needs_restart(cert, old)  # due: the running server must move to a new one
    ensure_certificate(tmp_path, HOSTS)
    assert cert.read_bytes() != old and _not_after(cert) != old_end
    assert not needs_restart(cert, cert.read_bytes())


def test_a_mounted_certificate_is_never_rewritten_but_its_rotation_is_noticed(tmp_path, monkeypatch):
    cert, _ = ensure_certificate(tmp_path, HOSTS, valid_days=1)
    served = cert.read_bytes()
    monkeypatch.setattr(certificates.os, "access", lambda *_: False)  # a read-only Secret volume
    ensure_certificate(tmp_path, HOSTS)
    assert cert.read_bytes() == served
    assert not needs_restart(cert, served)  # due, but its issuer renews it, not the operator
    monkeypatch.undo()
    (tmp_path / "tls.crt").unlink()
    ensure_certificate(tmp_path, HOSTS)  # the issuer wrote a new one
    assert needs_restart(cert, served)


@pytest.mark.parametrize("valid_days", [RENEW_BEFORE_DAYS + 2, 365])
def test_a_certificate_outside_the_window_is_not_due(tmp_path, valid_days):
    cert, _ = ensure_certificate(tmp_path, HOSTS, valid_days=valid_days)
    assert not needs_restart(cert, cert.read_bytes())

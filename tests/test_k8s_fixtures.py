"""The control plane fixtures' own helpers that tests rely on for timing-sensitive reads (no cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path

from .k8s_fixtures import ControlPlane


def test_the_audit_log_is_read_up_to_its_last_complete_line(tmp_path: Path) -> None:
    # The apiserver appends to audit.log while tests poll it: a read that lands mid-write sees half a line, and
    # json.loads of it failed test_optional_kinds.py under load (a shake on 2026-12-06).
    first = {"verb": "list", "requestURI": "/api/v1/pods", "user": {"username": "a"}}
    second = {"verb": "watch", "requestURI": "/api/v1/pods?watch=1", "user": {"username": "a"}}
    line = json.dumps(second)
    log = tmp_path / "audit.log"
    log.write_text(json.dumps(first) + "\n" + line[:20])
    plane = ControlPlane(tmp_path, {})
    assert plane.audit_events() == [first]
    log.write_text(json.dumps(first) + "\n" + line + "\n")
    assert plane.audit_events() == [first, second]

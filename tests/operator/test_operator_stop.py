"""How long the operator takes to stop on SIGTERM, as Kubernetes stops its pod."""

from __future__ import annotations

import time

from .conftest import OperatorProcess

# kopf, stopping for a signal, gives its leftover tasks 5 s before cancelling them; its own stop-flag waiter was one
# (main.register_stop_flag_raiser), so every stop took over 5 s. A stop is a fraction of a second now: this bound is
# loose for a loaded machine and still below the 5 s wait.
STOP_BOUND_S = 4.0


def test_sigterm_stops_the_operator_without_kopfs_leftover_wait(operator_process: OperatorProcess) -> None:
    """SIGTERM: the operator withdraws its webhooks and exits within STOP_BOUND_S, with exit code 0."""
    proc = operator_process.proc
    assert proc is not None and proc.poll() is None
    started = time.monotonic()
    operator_process.stop()
    took = time.monotonic() - started
    log = operator_process.log_path.read_text(errors="replace")
    assert proc.returncode == 0, operator_process.tail()
    assert "Signal SIGTERM is received" in log and "Cleaning up the admission webhook" in log
    assert took < STOP_BOUND_S, f"the operator took {took:.1f} s to stop:\n{operator_process.tail()}"

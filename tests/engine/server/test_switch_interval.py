"""FLOTILLA_API_SWITCH_INTERVAL, the API process's GIL switch interval (engine/server/cli.py), is checked at start-up
with the flags: a bad value is a usage error naming the variable, before anything loads."""

from __future__ import annotations

import pytest

from flotilla.engine.server.cli import SWITCH_INTERVAL, SWITCH_INTERVAL_ENV, main, switch_interval


@pytest.mark.parametrize("text", ["abc", "", "0", "-1", "nan", "inf", "2"])
def test_a_bad_switch_interval_is_a_usage_error(tiny_model_dirs, monkeypatch, capsys, text):
    # It was a ValueError traceback ("abc", "0", "-1"), or taken: "nan" gave 2**63 ns, "inf" 0, "2" two seconds
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, text)
    assert main([str(tiny_model_dirs["llama"]), "--max-model-len", "64"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"flotilla serve: error: {SWITCH_INTERVAL_ENV} is seconds from 0.000001 to 1 (Python's own is 0.005), "
        f"not {text!r}")


def test_the_switch_interval_is_the_variables_seconds_or_the_servers_own(monkeypatch):
    monkeypatch.delenv(SWITCH_INTERVAL_ENV, raising=False)
    assert switch_interval() == SWITCH_INTERVAL == 0.0005
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "0.005")
    assert switch_interval() == 0.005

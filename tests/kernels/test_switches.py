"""Environment switches (kernels/switches.py): unset means the default, a value outside the accepted set
fails loudly, naming the variable and what it accepts."""

import os
import subprocess
import sys

import pytest

from flotilla.kernels.switches import env_choice, env_flag, parse_choice

MODES = {"table": "table", "1": "all", "0": "off"}


def test_a_choice_maps_its_value_and_unset_or_blank_is_the_default(monkeypatch):
    monkeypatch.delenv("FLOTILLA_TEST_SWITCH", raising=False)
    assert env_choice("FLOTILLA_TEST_SWITCH", MODES, "table") == "table"
    for value, mode in (("1", "all"), (" 0 ", "off"), ("table", "table"), ("", "table"), ("  ", "table")):
        monkeypatch.setenv("FLOTILLA_TEST_SWITCH", value)
        assert env_choice("FLOTILLA_TEST_SWITCH", MODES, "table") == mode


def test_a_default_need_not_be_one_of_the_choices():
    assert parse_choice("FLOTILLA_INT4_GEMV_WIDE", "", {"1": 4, "0": 0}, 1) == 1


def test_an_unknown_value_names_the_variable_and_the_accepted_values(monkeypatch):
    monkeypatch.setenv("FLOTILLA_TEST_SWITCH", "off")
    with pytest.raises(ValueError, match=r"FLOTILLA_TEST_SWITCH='off': expected one of 'table', '1', '0'"):
        env_choice("FLOTILLA_TEST_SWITCH", MODES, "table")


def test_a_flag_takes_0_1_and_the_usual_words_in_any_case(monkeypatch):
    for value, on in (("0", False), ("1", True), ("False", False), ("ON", True), ("no", False), ("yes", True)):
        monkeypatch.setenv("FLOTILLA_TEST_SWITCH", value)
        assert env_flag("FLOTILLA_TEST_SWITCH", not on) is on
    monkeypatch.setenv("FLOTILLA_TEST_SWITCH", "")
    assert env_flag("FLOTILLA_TEST_SWITCH", None) is None
    monkeypatch.setenv("FLOTILLA_TEST_SWITCH", "2")
    with pytest.raises(ValueError, match="FLOTILLA_TEST_SWITCH='2'"):
        env_flag("FLOTILLA_TEST_SWITCH", True)


@pytest.mark.parametrize("name", ["FLOTILLA_SKINNY_GEMM", "FLOTILLA_FP8_GEMV", "FLOTILLA_INT4_GEMV_WIDE",
                                  "FLOTILLA_LORA_KERNELS", "FLOTILLA_PDL", "FLOTILLA_CPU_STEP_MEMO",
                                  "FLOTILLA_CPU_DECODE_LAYERS"])  # fmt: skip
def test_a_typo_in_a_kernel_switch_stops_the_import(name):
    env = {**os.environ, name: "typo"}
    code = "import flotilla.kernels.dispatch, flotilla.kernels.pdl, flotilla.engine.models.llama_cpu_decode"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and f"{name}='typo'" in out.stderr

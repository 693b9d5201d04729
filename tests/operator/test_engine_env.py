"""The engine's environment switches in spec.pod.env (operator/engine_env.py): a variable that stands for an engine
flag, or turns on the runtime adapter routes, is refused with where to set it instead; every variable the engine
reads is classified."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flotilla.flags import FLAGS
from flotilla.operator.admission import review
from flotilla.operator.deployment import OPERATOR_ENV
from flotilla.operator.engine_env import ENGINE_ENV_ALLOWED, RUNTIME_LORA_ENV, refused_names

REPO = Path(__file__).resolve().parents[2]
# A read of the environment: os.environ.get(X, ...), os.environ[X], X in os.environ, os.getenv(X), the kernels'
# switch readers env_flag/env_choice, and engine_rules' env.get(X) of a mapping that is the environment.
_READ = re.compile(r'(?:environ\.get|getenv|env_flag|env_choice|\benv\.get)\(\s*("?)([A-Z][A-Z0-9_]*)\1[,)]'
                   r'|environ\[\s*("?)([A-Z][A-Z0-9_]*)\3\s*\]|"([A-Z][A-Z0-9_]*)"\s+in\s+os\.environ')
_CONSTANT = re.compile(r'^([A-Z][A-Z0-9_]*)\s*=\s*"([A-Z][A-Z0-9_]*)"', re.M)


def engine_reads() -> set[str]:
    """Every environment variable that engine/ and flotilla/ read (a constant's name resolved in its module), and
    the flags' own variables (engine/arg_parser.py reads those)."""
    names = {f.env for f in FLAGS if f.env}
    for path in [*(REPO / "engine").rglob("*.py"), *(REPO / "flotilla").glob("*.py")]:
        text = path.read_text()
        constants = dict(_CONSTANT.findall(text))
        for match in _READ.finditer(text):
            quoted, name = (match.group(1) or match.group(3) or match.group(5) is not None), next(
                g for g in (match.group(2), match.group(4), match.group(5)) if g)
            names.add(name if quoted or name not in constants else constants[name])
    return names


def test_every_variable_the_engine_reads_is_classified():
    reads = engine_reads()
    # The scan finds what it must (so it cannot pass by finding nothing): a literal, a constant, a flag's variable.
    assert {RUNTIME_LORA_ENV, "FLOTILLA_RESPONSES_STORE_BYTES", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "RTN_NUM_BITS"} <= reads
    unclassified = reads - set(ENGINE_ENV_ALLOWED) - set(refused_names()) - set(OPERATOR_ENV)
    assert unclassified == set(), "classify these in operator/engine_env.py"
    assert not set(ENGINE_ENV_ALLOWED) & set(refused_names())


def _errors(**pod: object) -> list[str]:
    return review({"model": {"source": "pvc://m"}, "pod": pod}, "x").errors


@pytest.mark.parametrize(("name", "message"), [
    (RUNTIME_LORA_ENV,
     "spec.pod.env: VLLM_ALLOW_RUNTIME_LORA_UPDATING would turn on the engine's runtime adapter routes "
     "(/v1/load_lora_adapter), which let the model's API clients load any directory of the pod as an adapter; list "
     "the adapters in spec.lora.adapters instead"),
    ("VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
     "spec.pod.env: VLLM_HTTP_TIMEOUT_KEEP_ALIVE is the engine's --timeout-keep-alive: give --timeout-keep-alive in "
     "spec.engineArgs instead, where its value is checked"),
    ("VLLM_SERVER_DEV_MODE",
     "spec.pod.env: VLLM_SERVER_DEV_MODE would turn on the engine's development routes (/sleep, /wake_up), which let "
     "the model's API clients take the model off the GPU; no InferenceService serves them"),
    ("VLLM_API_KEY", "spec.pod.env: VLLM_API_KEY is set by the operator"),  # one message, the operator's
    ("VLLM_LOGGING_LEVEL", None), ("FLOTILLA_STEP_TRACE", None), ("MY_APP_SETTING", None),
])
def test_engine_switches_in_the_pods_env_are_refused_with_the_field_to_use(name, message):
    assert _errors(env=[{"name": name, "value": "1"}]) == ([message] if message else [])


@pytest.mark.parametrize(("prefix", "refused"), [
    ("VLLM_", True), ("V", True), ("VLLM_ALLOW_", True), ("VLLM_HTTP", True),
    ("APP_", False), ("VLLM_X", False), ("FLOTILLA_", False),
])
def test_an_env_from_prefix_that_could_spell_an_engine_switch_is_refused(prefix, refused):
    errors = _errors(envFrom=[{"configMapRef": {"name": "settings"}, "prefix": prefix}])
    assert bool(errors) == refused, errors
    if refused:
        assert errors[0].startswith(f"spec.pod.envFrom[0]: with the prefix {prefix!r}, a key of the Secret or "
                                    "ConfigMap could name ")
        assert errors[0].endswith("engine settings spec.pod.env may not set either; give a prefix none of them "
                                  "starts with (e.g. APP_)")

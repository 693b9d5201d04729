"""Spec -> engine command line, and the refusal of flags the engine does not implement yet."""

from __future__ import annotations

import json

import pytest

from flotilla.flags import FLAGS, flag
from flotilla.operator.engine_args import FIELD_VALUES, engine_args, engine_args_errors, unsupported
from flotilla.operator.spec import InferenceServiceSpec


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, **spec})


def flag_value(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_field_table_matches_the_flag_contract():
    assert set(FIELD_VALUES) == {f.crd_field for f in FLAGS if f.crd_field}


def test_model_path_comes_first_and_served_name_defaults_to_the_object_name():
    args = engine_args(make(), "llama")
    assert args[0] == "/model"
    assert flag_value(args, "--served-model-name") == "llama"
    assert flag_value(engine_args(make(model={"source": "pvc://m", "servedName": "chat"}), "llama"),
                      "--served-model-name") == "chat"


# (spec fields, flag, the value it should carry on the command line)
CASES = [
    ({"scheduling": {"maxModelLen": 8192}}, "--max-model-len", "8192"),
    ({"scheduling": {"maxNumSeqs": 64}}, "--max-num-seqs", "64"),
    ({"scheduling": {"maxNumBatchedTokens": 4096}}, "--max-num-batched-tokens", "4096"),
    ({"kvCache": {"blockSize": 32}}, "--block-size", "32"),
    ({"kvCache": {"gpuMemoryUtilization": 0.85}}, "--gpu-memory-utilization", "0.85"),
    ({"kvCache": {"dtype": "fp8"}}, "--kv-cache-dtype", "fp8"),
    ({"dtype": "float16"}, "--dtype", "float16"),
    ({"quantization": "fp8"}, "--quantization", "fp8"),
    ({"parallelism": {"tensor": 2}}, "--tensor-parallel-size", "2"),
    ({"parallelism": {"pipeline": 2}}, "--pipeline-parallel-size", "2"),
]


@pytest.mark.parametrize(("fields", "name", "value"), CASES, ids=[c[1] for c in CASES])
def test_each_field_sets_its_flag(fields, name, value):
    assert flag_value(engine_args(make(**fields), "x"), name) == value


def test_unset_optional_fields_leave_their_flag_out():
    args = engine_args(make(), "x")
    for name in ("--max-model-len", "--max-num-batched-tokens", "--quantization", "--speculative-config",
                 "--enable-lora", "--api-key"):
        assert name not in args


def test_booleans_render_as_negatable_switches():
    on = engine_args(make(scheduling={"chunkedPrefill": True}), "x")
    off = engine_args(make(scheduling={"chunkedPrefill": False}), "x")
    chunked = flag("--enable-chunked-prefill")
    assert "--enable-chunked-prefill" in on
    assert ("--no-enable-chunked-prefill" in off) == chunked.implemented


def test_speculative_config_is_json_in_the_engine_naming():
    args = engine_args(make(speculative={"method": "ngram", "numTokens": 3}), "x")
    assert json.loads(flag_value(args, "--speculative-config")) == {"method": "ngram", "num_speculative_tokens": 3}


def test_api_key_never_appears_on_the_command_line():
    args = engine_args(make(apiKeySecretRef={"name": "llm-key"}), "x")
    assert "--api-key" not in args and "llm-key" not in " ".join(args)


def test_engine_args_are_appended_last():
    assert engine_args(make(engineArgs=["--enforce-eager", "--seed", "7"]), "x")[-3:] == \
        ["--enforce-eager", "--seed", "7"]


# A spec field whose flag is not implemented (or whose value is outside supported_values) is refused,
# whatever flags.py says today: the expectations are derived from the flag table itself.
FIELD_SAMPLES = {
    "quantization": {"quantization": "fp8"},
    "kvCache.dtype": {"kvCache": {"dtype": "fp8"}},
    "kvCache.prefixCaching": {"kvCache": {"prefixCaching": False}},
    "scheduling.chunkedPrefill": {"scheduling": {"chunkedPrefill": True}},
    "parallelism.tensor": {"parallelism": {"tensor": 2}},
    "parallelism.pipeline": {"parallelism": {"pipeline": 2}},
    "speculative": {"speculative": {"method": "ngram"}},
    "lora": {"lora": {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}},
    "apiKeySecretRef": {"apiKeySecretRef": {"name": "llm-key"}},
    "kvCache.blockSize": {"kvCache": {"blockSize": 32}},
    "dtype": {"dtype": "float16"},
    "scheduling.maxModelLen": {"scheduling": {"maxModelLen": 4096}},
}


@pytest.mark.parametrize("crd_field", sorted(FIELD_SAMPLES))
def test_fields_are_refused_exactly_when_their_flag_cannot_take_the_value(crd_field):
    f = flag_for(crd_field)
    spec = make(**FIELD_SAMPLES[crd_field])
    expected = f.check_value(FIELD_VALUES[crd_field](spec, "x"))
    errors = unsupported(spec, "x")
    if expected is None:
        assert errors == []
    else:
        assert errors == [f"spec.{crd_field}: {expected}"]
        assert f.name in errors[0]


def flag_for(crd_field: str):
    return next(f for f in FLAGS if f.crd_field == crd_field)


def test_refusal_messages_name_the_field_and_say_why():
    lora = flag("--enable-lora")
    if not lora.implemented:
        assert unsupported(make(lora={}), "x") == [
            "spec.lora: --enable-lora is not implemented yet in this Flotilla version"]


def test_default_spec_is_startable():
    assert unsupported(make(), "x") == []


@pytest.mark.parametrize(("extra", "error"), [
    (["--enforce-eager"], None),
    (["--seed", "3"], None),
    (["--seed=3"], None),
    (["--bogus"], "spec.engineArgs: --bogus is not an engine flag"),
    (["--max-model-len", "4096"], "spec.engineArgs: --max-model-len is set by spec.scheduling.maxModelLen; "
                                  "set that field instead"),
    (["-tp", "2"], "spec.engineArgs: --tensor-parallel-size is set by spec.parallelism.tensor; "
                   "set that field instead"),
    (["--host", "0.0.0.0"], "spec.engineArgs: --host is not implemented yet in this Flotilla version"),
])
def test_engine_args_are_checked_against_the_flag_table(extra, error):
    if error and "not implemented" in error and flag(extra[0]).implemented:
        error = None
    assert engine_args_errors(extra) == ([error] if error else [])

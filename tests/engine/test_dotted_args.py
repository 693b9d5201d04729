"""vLLM's dotted forms of a JSON-object flag (`--compilation-config.cudagraph_mode FULL`, `-cc.key value`,
`--hf-overrides.key value`): each is the JSON object it spells (flotilla/dotted_args.py)."""

from __future__ import annotations

import pytest

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.config import EngineConfig
from flotilla.engine.server.cli import build_parser, main


def _values(*argv: str) -> dict:
    return flag_values(build_parser().parse_args(argv), ENGINE_COMPONENTS)


@pytest.mark.parametrize(("argv", "values"), [
    (("--compilation-config.cudagraph_mode", "FULL_DECODE_ONLY"),
     {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}),  # not JSON: the text itself
    (("-cc.cudagraph_capture_sizes", "[1,2,4]", "-cc.max_cudagraph_capture_size=4"),  # one flag's keys merge
     {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 4}}),
    (("-cc.cudagraph_capture_sizes+", "1,2", "--compilation_config.cudagraph_capture_sizes+=4"),  # lists join
     {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}}),
    (("-O.mode", "3"), {"compilation_config": {"mode": 3}}),  # -O as vLLM's older --compilation-config alias
    (("-O3", "-cc.mode", "0"), {"optimization_level": 3, "compilation_config": {"mode": 0}}),
    (("--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "3"),
     {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
    (("--hf-overrides.rope_scaling.rope_type", "yarn", "--hf-overrides.rope_scaling.factor=2.0",
      "--hf_overrides.max_position_embeddings", "1k"),  # nested keys, and vLLM's human-readable integers
     {"hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}, "max_position_embeddings": 1000}}),
    (("--hf-overrides.is_matryoshka", "true", "--max-model-len", "-0.5k"),  # a value that looks dotted stays one
     None),
])
def test_dotted_keys_are_the_json_object_they_spell(argv, values):
    if values is None:  # "-0.5k" is --max-model-len's value (argparse then refuses it), not a dotted flag
        with pytest.raises(SystemExit):
            _values(*argv)
        return
    assert _values(*argv) == values


def test_the_dotted_form_builds_the_engine_the_json_form_builds(tiny_model_dirs):
    path = str(tiny_model_dirs["llama"])
    dotted = EngineConfig.from_kwargs(path, **_values("-cc.cudagraph_capture_sizes", "[1,2,4]", "-O.mode", "3",
                                                      "--hf-overrides.max_position_embeddings", "256"))
    plain = EngineConfig.from_kwargs(path, **_values("-cc", '{"cudagraph_capture_sizes": [1, 2, 4], "mode": 3}',
                                                     "--hf-overrides", '{"max_position_embeddings": 256}'))
    assert dotted == plain
    assert (dotted.model.max_model_len, dotted.model.max_cudagraph_capture_size) == (256, 4)


@pytest.mark.parametrize(("argv", "message"), [
    (("--port.x", "1"), "--port takes no dotted keys: only a flag whose value is a JSON object does "
                        "(--compilation-config, --default-chat-template-kwargs, --hf-overrides,"),
    (("--allowed-origins.x", "1"), "--allowed-origins takes no dotted keys"),  # a JSON list
    (("--no-such.x", "1"), "--no-such: no such flag"),
    (("-cc", '{"cudagraph_capture_sizes": [1]}', "-cc.cudagraph_mode", "FULL"),
     "--compilation-config is given both as a JSON value (-cc) and as dotted keys: give one form (vLLM would keep "
     "the dotted keys alone and drop the value's)"),
    (("--hf-overrides.", "1"), "--hf-overrides.: an empty key"),
    (("--hf-overrides.num_hidden_layers",), "--hf-overrides.num_hidden_layers: expected a value"),
    (("--hf-overrides.num_hidden_layers", "9"), "--hf-overrides: num_hidden_layers 9 is more than the checkpoint's"),
])
def test_a_dotted_key_that_cannot_be_taken_is_a_usage_error(tiny_model_dirs, capsys, argv, message):
    # --port 70000 is refused after the engine's flags: nothing is ever served by this test
    try:
        code = main([str(tiny_model_dirs["llama"]), "--port", "70000", *argv])
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    assert code == 2
    assert f"flotilla serve: error: {message}" in capsys.readouterr().err


DEEP_JSON = "[" * 5000 + "]" * 5000  # past Python's recursion limit: json.loads raises RecursionError


@pytest.mark.parametrize("argv", [("--hf-overrides", DEEP_JSON), ("-cc", DEEP_JSON), ("--hf-overrides.x", DEEP_JSON)])
def test_json_nested_too_deeply_is_a_usage_error_not_a_crash(tiny_model_dirs, capsys, argv):
    try:
        code = main([str(tiny_model_dirs["llama"]), "--port", "70000", *argv])
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "flotilla serve: error:" in err and "RecursionError" not in err

"""`vllm serve` command lines that were refused as unrecognized: `--config FILE` (vLLM's YAML file of flags, the
command line winning over it) and the flags with one meaning here (`-dp 1`, `--distributed-executor-backend mp`,
`--disable-custom-all-reduce`), accepted at that value and refused at any other, naming what runs."""

from __future__ import annotations

import httpx
import openai
import pytest

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.server.cli import build_parser, main
from flotilla.engine.server.config_file import ConfigFileError, ConfigFileParser, apply_config_file

from .conftest import start_server, stop_server


def test_a_config_file_starts_the_server_and_the_command_line_wins(tiny_model_dirs, tmp_path):
    # Each value the command line also gives would break the server if the file's won: port 1 cannot be bound,
    # the file's model does not exist, and max-model-len 100 would show in /v1/models.
    config = tmp_path / "serve.yaml"
    config.write_text(
        "# a vLLM manifest's config file\n"
        "model: /nonexistent/model\n"
        "port: 1\n"
        "max_model_len: 100\n"
        "served-model-name: [from-file, also-from-file]\n"
        "enforce-eager: true\n"
        "enable-prefix-caching: false\n"
        "override-generation-config: {temperature: 0.0}\n"
        "distributed-executor-backend: mp\n"
        "disable_custom_all_reduce: true\n"
        "data-parallel-size: 1\n")
    server = start_server(tiny_model_dirs["llama"], tmp_path / "server.log", "--config", str(config),
                          "--max-model-len", "64", "-dp", "1")
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("from-file", 64), ("also-from-file", 64)]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        chat = client.chat.completions.create(model="also-from-file", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2)
        assert chat.usage.completion_tokens == 2
    finally:
        stop_server(server)


@pytest.mark.parametrize(("text", "message"), [
    ("max-model-len: 64\nbogus_flag: 1\n", "key 'bogus_flag' is not a flag of flotilla serve"),
    ("max-model-len: [64, 128]\n", "key 'max-model-len' takes a single value, not [64, 128]"),
    ("enforce-eager: maybe\n", "key 'enforce-eager' is a boolean flag: give true or false, not 'maybe'"),
    ("served-model-name: []\n", "key 'served-model-name' takes one value or more, not an empty list"),
    ("config: other.yaml\n", "key 'config': a config file cannot name another one"),
    ("- max-model-len\n- 64\n", "must be a mapping of flag names to values"),
    ("max-model-len: [64\n", "is not YAML (expected ',' or ']'"),
    ("max-model-len: lots\n", "argument --max-model-len: 'lots' is not an integer"),
    ("dtype: int4\n", "argument --dtype: invalid choice: 'int4'"),
])
def test_a_bad_config_file_is_a_usage_error_naming_the_file(tiny_model_dirs, tmp_path, capsys, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error; a traceback would be another exception
        main(["--port", "70000", "--config", str(config), str(tiny_model_dirs["llama"])])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"flotilla serve: error: --config {config}: {message}" in err, err


def _file_values(tmp_path, text: str, *argv: str) -> dict:
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    args = apply_config_file(build_parser().parse_args(["--config", str(config), *argv]),
                             build_parser(ConfigFileParser))
    return flag_values(args, (*ENGINE_COMPONENTS, "server"))


@pytest.mark.parametrize(("text", "values"), [
    # a mapping is the flag's JSON object, nested as deep as it goes
    ("hf-overrides: {rope_theta: 20000.0, rope_scaling: {rope_type: linear, factor: 2.0}}\n",
     {"hf_overrides": {"rope_theta": 20000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}}),
    # dotted keys are the flag's dotted form (underscores in the name too), merged into one object
    ("compilation-config.mode: 3\ncompilation_config.cudagraph_capture_sizes: [1, 2]\n",
     {"compilation_config": {"mode": 3, "cudagraph_capture_sizes": [1, 2]}}),
    ("hf_overrides.rope_scaling: {rope_type: yarn, factor: 4}\nhf-overrides.is_matryoshka: true\n"
     "hf-overrides.max_position_embeddings: 32k\n",
     {"hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4}, "is_matryoshka": True,
                       "max_position_embeddings": 32000}}),
    ("max_model_len: 100\nenable_prefix_caching: false\n", {"max_model_len": 100, "enable_prefix_caching": False}),
])
def test_a_config_files_nested_dotted_and_underscore_keys_are_read_as_vllm_reads_them(tmp_path, text, values):
    assert _file_values(tmp_path, text) == values


def test_the_command_lines_object_wins_over_the_files_dotted_keys(tmp_path):
    assert _file_values(tmp_path, "compilation-config.mode: 3\n", "-cc.cudagraph_mode", "NONE") == {
        "compilation_config": {"cudagraph_mode": "NONE"}}


@pytest.mark.parametrize(("text", "message"), [
    ("no-such.x: 1\n", "key 'no-such.x' is not a flag of flotilla serve (a dotted key follows a JSON flag's name"),
    ("port.x: 1\n", "--port takes no dotted keys"),
    ("hf-overrides: {rope_theta: 1.0}\nhf-overrides.is_matryoshka: true\n",
     "--hf-overrides is given both as a JSON value (--hf-overrides) and as dotted keys"),
])
def test_a_dotted_key_the_flag_cannot_take_is_a_usage_error_naming_the_file(tmp_path, text, message):
    with pytest.raises(ConfigFileError) as refused:
        _file_values(tmp_path, text)
    assert message in str(refused.value)
    assert str(refused.value).startswith(f"--config {tmp_path / 'serve.yaml'}: ")


def test_a_missing_config_file_is_a_usage_error(tiny_model_dirs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--port", "70000", "--config", str(tmp_path / "absent.yaml"), str(tiny_model_dirs["llama"])])
    assert exit_.value.code == 2
    assert (f"flotilla serve: error: --config {tmp_path / 'absent.yaml'}: cannot be read (No such file or directory)"
            in capsys.readouterr().err)


@pytest.mark.parametrize(("flags", "message"), [
    (["-dp", "2"], "--data-parallel-size=2 is not supported yet (supported: 1): one server runs one engine; for "
                   "more copies of the model run more replicas (an InferenceService's spec.replicas"),
    (["--distributed-executor-backend", "ray"],
     "--distributed-executor-backend='ray' is not supported yet (supported: mp, uni): Flotilla runs every "
     "tensor/pipeline rank as a worker process it spawns on this host (vLLM's mp)"),
])
def test_fixed_meaning_flags_refuse_other_values_naming_what_runs(tiny_model_dirs, capsys, flags, message):
    # --port 70000 is refused after the engine's flags: nothing is ever served by this test
    assert main([str(tiny_model_dirs["llama"]), *flags, "--port", "70000"]) == 2
    assert f"flotilla serve: error: {message}" in capsys.readouterr().err

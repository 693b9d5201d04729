"""`vllm serve` command lines that were refused as unrecognized: `--config FILE` (vLLM's YAML file of flags, the
command line winning over it) and the flags with one meaning here (`-dp 1`, `--distributed-executor-backend mp`,
`--disable-custom-all-reduce`), accepted at that value and refused at any other, naming what runs."""

from __future__ import annotations

import httpx
import openai
import pytest

from flotilla.engine.server.cli import main

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

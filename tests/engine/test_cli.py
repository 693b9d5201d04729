"""The command line: flags built from the one declaration, and `flotilla generate` end to end."""

from __future__ import annotations

import subprocess
import sys
from unittest import mock

import pytest

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.generate_cli import build_parser
from flotilla.flags import FLAGS
from tests.test_engine_rules import HUMAN_READABLE_INTS, NOT_HUMAN_READABLE_INTS


def test_every_engine_flag_parses_to_a_config_argument(tiny_model_dirs):
    args = build_parser().parse_args(
        [
            "--max-model-len",
            "128",
            "--block-size",
            "32",
            "--max-num-seqs",
            "4",
            "--no-enable-prefix-caching",
            "--enable-chunked-prefill",
            "--max-num-batched-tokens",
            "64",
            "--served-model-name",
            "a",
            "b",
            "--dtype",
            "float32",
            "-tp",
            "1",
            "--max-cudagraph-capture-size",
            "1024",
        ]
    )
    values = flag_values(args, ENGINE_COMPONENTS)
    assert values == {
        "max_model_len": 128,
        "block_size": 32,
        "max_num_seqs": 4,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 64,
        "served_model_name": ["a", "b"],
        "dtype": "float32",
        "tensor_parallel_size": 1,
        "max_cudagraph_capture_size": 1024,
    }
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), **values)
    assert config.cache.block_size == 32 and not config.cache.enable_prefix_caching
    assert config.scheduler.max_num_batched_tokens == 64 and config.scheduler.enable_chunked_prefill
    assert config.model.served_model_name == ["a", "b"]
    assert config.model.max_cudagraph_capture_size == 1024


UNDERSCORE_CASES = [
    (["--max_model_len", "4096"], {"max_model_len": 4096}),
    (["--max_model_len=4k"], {"max_model_len": 4000}),
    (["--enable_prefix_caching"], {"enable_prefix_caching": True}),
    (["--no_enable_prefix_caching"], {"enable_prefix_caching": False}),
    (["--no-enable_prefix_caching"], {"enable_prefix_caching": False}),
    # the name only: a value keeps its underscores, after `=` or as the next token, and so do a dotted flag's keys
    (["--served_model_name", "my_model", "other_name"], {"served_model_name": ["my_model", "other_name"]}),
    (["--logprobs_mode=raw_logits", "--seed", "1"], {"logprobs_mode": "raw_logits", "seed": 1}),
    (["--hf_overrides.rope_scaling.rope_type", "linear", "--hf_overrides.rope_scaling.factor=2"],
     {"hf_overrides": {"rope_scaling": {"rope_type": "linear", "factor": 2}}}),
]


@pytest.mark.parametrize(("argv", "values"), UNDERSCORE_CASES)
def test_a_flag_name_with_underscores_is_the_dashed_flag_as_in_vllm(argv, values):
    from flotilla.engine.server.cli import build_parser as serve_parser

    assert flag_values(build_parser().parse_args(argv), ENGINE_COMPONENTS) == values  # flotilla generate
    assert flag_values(serve_parser().parse_args(argv), ENGINE_COMPONENTS) == values  # flotilla serve


def test_underscores_after_the_end_of_the_flags_are_left_alone():
    args = build_parser().parse_args(["--max_model_len", "64", "--", "my_model_dir"])
    assert (args.model, args.max_model_len) == ("my_model_dir", 64)


def test_an_unknown_underscore_flag_is_refused_by_its_dashed_name(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max_model_lenn", "64"])
    assert "unrecognized arguments: --max-model-lenn" in capsys.readouterr().err


def test_lengths_in_vllms_human_readable_form():
    """The engine's parser reads `vllm serve`'s 32k / 32K forms as the operator's grammar does."""
    for text, value in HUMAN_READABLE_INTS.items():
        args = build_parser().parse_args(["--max-model-len", text, "--max-num-batched-tokens", text])
        assert (args.max_model_len, args.max_num_batched_tokens) == (value, value)
    for text in NOT_HUMAN_READABLE_INTS:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--max-model-len", text])


@pytest.mark.parametrize(("text", "words"), [("0.5", "'0.5' is not an integer"),
                                             ("1.5K", "'1.5K': a fraction takes a decimal suffix")])
def test_a_fraction_is_refused_in_words_that_fit_it(capsys, text, words):
    """A plain fraction is no integer (vLLM's int() refuses it too); only one with a binary suffix is told to take
    a decimal suffix instead, since it has a suffix to change."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-model-len", text])
    assert f"argument --max-model-len: {words}" in capsys.readouterr().err


def test_load_format_safetensors_is_refused_for_a_gguf_model():
    """vLLM's --load-format safetensors names what auto reads of an HF directory; a .gguf model has none to read."""
    with pytest.raises(ConfigError, match="--load-format safetensors reads an HF directory"):
        EngineConfig.from_kwargs(None, quantization="gguf", load_format="safetensors")


def test_flag_declaration_covers_every_config_field():
    engine_dests = {f.dest for f in FLAGS if f.component in ENGINE_COMPONENTS}
    declared = set()
    for component in ("model", "cache", "scheduler", "parallel", "device"):
        declared |= set(EngineConfig.model_fields[component].annotation.model_fields)
    internal = {"hf_config", "model", "cpu_kv_cache_bytes"}
    assert declared - internal <= engine_dests | {"quantization"}
    assert all(f.name.startswith("--") and f.name == f.name.lower() for f in FLAGS)


def test_generate_command_prints_completions(tiny_model_dirs):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flotilla.cli",
            "generate",
            str(tiny_model_dirs["llama"]),
            "-p",
            "Hello there",
            "--max-tokens",
            "5",
            "--max-model-len",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("### Hello there\n")


def test_generate_command_reports_bad_flags_clearly(tiny_model_dirs):
    result = subprocess.run(
        [sys.executable, "-m", "flotilla.cli", "generate", str(tiny_model_dirs["llama"]), "--quantization", "int8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "--quantization='int8' is not supported yet" in result.stderr
    assert "Traceback" not in result.stderr


def test_auto_for_the_step_budget_is_no_integer_rather_than_max_model_len_auto(capsys):
    """vLLM's `auto` / -1 is --max-model-len's (fit the context to memory); --max-num-batched-tokens has no such
    value, so its refusal must not speak of --max-model-len: `auto` is no integer, -1 is out of the flag's range."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-num-batched-tokens", "auto"])
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the usage lines
    assert "argument --max-num-batched-tokens: 'auto' is not an integer" in error and "max-model-len" not in error
    # `flotilla serve` in this process (a process cost CI an import of torch): the flag taken by mistake would fail
    # here at once instead of starting an engine
    from flotilla import cli
    from flotilla.engine.server import cli as server_cli

    with mock.patch.object(server_cli, "_start_engine", side_effect=AssertionError("the engine would start")):
        try:
            status = cli.main(["serve", "--max-num-batched-tokens", "-1"])
        except SystemExit as exc:  # a parser error
            status = exc.code
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    assert "--max-num-batched-tokens=-1 is out of range (>= 1)" in stderr
    assert "max-model-len" not in stderr.strip().splitlines()[-1]

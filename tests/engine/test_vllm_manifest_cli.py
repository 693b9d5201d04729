"""`vllm serve` flags that existing commands and manifests carry, as the command line and the config read them.
What a running server does with them: tests/engine/server/test_vllm_manifest_flags.py."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from unittest import mock

import pytest

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.config import ConfigError, EngineConfig, ServerConfig
from flotilla.engine.errors import InvalidParamError
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.cli import build_parser


def _serve(*args: str) -> tuple[int, str]:
    """`flotilla serve ARGS` run in this process (a process each cost CI an import of torch, ~5 s): its exit status
    and what it wrote to stderr. Flags taken by mistake fail at once here instead of starting an engine."""
    from flotilla import cli
    from flotilla.engine.server import cli as server_cli

    err = io.StringIO()
    with (mock.patch.object(server_cli, "_start_engine", side_effect=AssertionError("the engine would start")),
          contextlib.redirect_stderr(err)):
        try:
            status = cli.main(["serve", *args])
        except SystemExit as exc:  # a parser error
            status = exc.code if isinstance(exc.code, int) else 1
    return status, err.getvalue()


def _config(model, *argv: str) -> EngineConfig:
    return EngineConfig.from_kwargs(str(model), **flag_values(build_parser().parse_args(argv), ENGINE_COMPONENTS))


def test_model_flag_is_model(tmp_path):
    """vLLM's --model X is MODEL: the missing directory it names is the one the error reports."""
    status, stderr = _serve("--model", str(tmp_path / "nowhere"))
    assert status == 2 and f"model {tmp_path / 'nowhere'}: no config.json" in stderr, stderr


def test_model_given_twice_must_agree(tmp_path):
    status, stderr = _serve(str(tmp_path / "a"), "--model", str(tmp_path / "b"))
    assert status == 2
    assert f"MODEL '{tmp_path / 'a'}' and --model '{tmp_path / 'b'}' differ" in stderr
    assert "Traceback" not in stderr


def test_trust_remote_code_is_accepted_for_a_built_in_architecture(tiny_model_dirs):
    config = _config(tiny_model_dirs["llama"], "--trust-remote-code")
    assert config.model.hf_config["architectures"] == ["LlamaForCausalLM"]


@pytest.fixture
def custom_code_model(tiny_model_dirs, tmp_path):
    """A config.json that maps an architecture not built in to the checkpoint's own code."""
    hf_config = json.loads((tiny_model_dirs["llama"] / "config.json").read_text())
    hf_config |= {"architectures": ["MyLMForCausalLM"], "auto_map": {"AutoModelForCausalLM": "modeling_my.MyLM"}}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    return tmp_path


@pytest.mark.parametrize("flags", [(), ("--trust-remote-code",)])
def test_a_model_needing_its_own_code_is_refused_with_or_without_trust_remote_code(custom_code_model, flags):
    with pytest.raises(ConfigError, match="auto_map asks for the checkpoint's own Python code for MyLMForCausalLM; "
                                          r"(--trust-remote-code does not change this: )?Flotilla never runs") as err:
        _config(custom_code_model, *flags)
    assert ("--trust-remote-code does not change this" in str(err.value)) == bool(flags)
    assert "LlamaForCausalLM" in str(err.value)  # the architectures it does serve


def test_a_built_in_architecture_shipping_code_too_is_served_by_the_built_in_one(tiny_model_dirs, tmp_path):
    shutil.copytree(tiny_model_dirs["llama"], tmp_path / "m")
    hf_config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(hf_config | {"auto_map": {"AutoConfig": "x.Y"}}))
    assert _config(tmp_path / "m").model.hf_config["auto_map"] == {"AutoConfig": "x.Y"}


def test_max_logprobs_default_and_minus_one(tiny_model_dirs):
    assert _config(tiny_model_dirs["llama"]).model.logprobs_cap == 20  # vLLM's default
    vocab = json.loads((tiny_model_dirs["llama"] / "config.json").read_text())["vocab_size"]
    assert _config(tiny_model_dirs["llama"], "--max-logprobs", "-1").model.logprobs_cap == vocab
    with pytest.raises(ConfigError, match=r"--max-logprobs=-2 is out of range \(>= -1\)"):
        _config(tiny_model_dirs["llama"], "--max-logprobs", "-2")


def test_the_engine_refuses_logprobs_above_the_cap_in_vllms_words():
    SamplingParams(logprobs=50, prompt_logprobs=50).check_logprobs(50)
    with pytest.raises(InvalidParamError, match="^Requested sample logprobs of 51, which is greater than max "
                                                "allowed: 50$") as err:
        SamplingParams(logprobs=51).check_logprobs(50)
    assert err.value.param == "logprobs"
    with pytest.raises(InvalidParamError, match="^Requested prompt logprobs of 21") as err:
        SamplingParams(prompt_logprobs=21).check_logprobs(20)
    assert err.value.param == "prompt_logprobs"


def test_request_log_flags():
    def server(*argv: str) -> ServerConfig:
        return ServerConfig.from_kwargs(**flag_values(build_parser().parse_args(argv), ("server",)))

    assert not server().enable_log_requests  # off by default, as vLLM's
    assert server("--enable-log-requests").enable_log_requests
    assert not server("--no-enable-log-requests").enable_log_requests  # vLLM's negation
    assert not server("--disable-log-requests").enable_log_requests
    # vLLM's --disable-log-requests is a BooleanOptionalAction too: its negation is the default, and says nothing
    # against --enable-log-requests
    assert not server("--no-disable-log-requests").enable_log_requests
    assert server("--enable-log-requests", "--no-disable-log-requests").enable_log_requests
    with pytest.raises(ConfigError, match="--enable-log-requests and --disable-log-requests contradict"):
        server("--enable-log-requests", "--disable-log-requests")


@pytest.mark.parametrize("value", ["auto", "-1"])
def test_max_model_len_auto_is_refused_saying_what_it_means(value, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-model-len", value])
    error = capsys.readouterr().err
    assert "vLLM's --max-model-len auto" in error and "not supported yet" in error, error


def test_max_num_batched_tokens_auto_is_not_max_model_lens(capsys):
    """vLLM takes `auto` / -1 for --max-model-len only: --max-num-batched-tokens auto is no integer there, -1 out of
    range; neither refusal speaks of --max-model-len."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-num-batched-tokens", "auto"])
    error = capsys.readouterr().err.splitlines()[-1]  # (the usage lines above it list every flag)
    assert "--max-num-batched-tokens: 'auto' is not an integer" in error and "--max-model-len" not in error, error
    with pytest.raises(ConfigError, match=r"^--max-num-batched-tokens=-1 is out of range \(>= 1\)$"):
        EngineConfig.from_kwargs(None, **flag_values(build_parser().parse_args(["--max-num-batched-tokens", "-1"]),
                                                     ENGINE_COMPONENTS))


@pytest.mark.parametrize("mode", ["auto", "hf"])
def test_tokenizer_mode_auto_and_hf_are_accepted(tiny_model_dirs, mode):
    assert _config(tiny_model_dirs["llama"], "--tokenizer-mode", mode).model.tokenizer


@pytest.mark.parametrize("mode", ["slow", "mistral", "custom"])
def test_other_tokenizer_modes_are_refused_saying_why(tiny_model_dirs, mode):
    with pytest.raises(ConfigError, match=f"--tokenizer-mode='{mode}' is not supported yet \\(supported: auto, hf\\): "
                                          "the tokenizer is loaded only as vLLM's auto and hf modes load it"):
        _config(tiny_model_dirs["llama"], "--tokenizer-mode", mode)


@pytest.mark.parametrize(("flag", "why"), [("--revision", "picks a Hugging Face Hub version to download"),
                                           ("--tokenizer-revision", "version of the tokenizer to download"),
                                           ("--download-dir", "where vLLM downloads Hub weights")])
def test_hub_download_flags_are_refused_by_name(tiny_model_dirs, flag, why):
    with pytest.raises(ConfigError, match=f"^{flag} is not supported: it .*{why}.*local directories only"):
        _config(tiny_model_dirs["llama"], flag, "main")


def test_the_uni_executor_is_what_runs_at_one_rank_and_only_there(tiny_model_dirs):
    # vLLM's uni: the model in the engine's own process, as here at -tp 1 -pp 1; more ranks are worker processes (mp).
    assert _config(tiny_model_dirs["llama"], "--distributed-executor-backend", "uni").parallel.tensor_parallel_size == 1
    with pytest.raises(ConfigError, match=r"^--distributed-executor-backend uni runs the model in the engine's own "
                                          r"process, one rank; --tensor-parallel-size 2 x --pipeline-parallel-size 1 "
                                          r"ranks run as worker processes: use mp \(or leave it out\)$"):
        _config(tiny_model_dirs["llama"], "--distributed-executor-backend", "uni", "-tp", "2")
    with pytest.raises(ConfigError, match="--pipeline-parallel-size 2 ranks run as worker processes"):
        _config(tiny_model_dirs["llama"], "--distributed-executor-backend", "uni", "-pp", "2")


def test_server_flags_of_vllm_manifests():
    def server(*argv: str) -> ServerConfig:
        return ServerConfig.from_kwargs(**flag_values(build_parser().parse_args(argv), ("server",)))

    default = server()
    assert (default.max_log_len, default.response_role, default.return_tokens_as_token_ids) == (None, "assistant",
                                                                                                  False)
    given = server("--max-log-len", "0", "--response-role", "tool", "--return-tokens-as-token-ids",
                   "--disable-uvicorn-access-log", "--disable-access-log-for-endpoints", "/health,/metrics")
    assert (given.max_log_len, given.response_role, given.return_tokens_as_token_ids) == (0, "tool", True)
    assert given.disable_uvicorn_access_log and given.disable_access_log_for_endpoints == "/health,/metrics"
    with pytest.raises(ConfigError, match="--max-log-len: Input should be greater than or equal to 0"):
        server("--max-log-len", "-1")


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash", "xxhash_cbor"])
def test_vllms_newer_hash_algorithms_are_refused_naming_the_ones_run_here(tiny_model_dirs, algo):
    with pytest.raises(ConfigError, match=f"--prefix-caching-hash-algo='{algo}' is not supported yet "
                                          r"\(supported: sha256, builtin\)"):
        _config(tiny_model_dirs["llama"], "--prefix-caching-hash-algo", algo)


@pytest.mark.parametrize("args", [["--help"], ["version"]])  # (argparse's own --help already ignores a closed pipe)
def test_output_into_a_closed_pipe_ends_without_a_traceback(args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head`) is gone before anything is written
    try:
        result = subprocess.run([sys.executable, "-m", "flotilla.cli", *args], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


def test_an_unknown_vllm_logging_level_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "chatty")
    status, stderr = _serve()
    assert status == 2 and "VLLM_LOGGING_LEVEL='chatty' is not a log level" in stderr, stderr


def test_the_offline_engine_applies_max_logprobs(tiny_model_dirs):
    """The engine's own check (what LLM and any front end share): up to --max-logprobs served, above it refused."""
    from flotilla.engine.llm import LLM

    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, device="cpu", max_logprobs=2)
    [out] = llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=2, temperature=0), use_tqdm=False)
    assert all(len(entry) >= 2 for entry in out.outputs[0].logprobs)
    with pytest.raises(InvalidParamError, match="Requested sample logprobs of 3, which is greater than max allowed: 2"):
        llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=3), use_tqdm=False)
    with pytest.raises(InvalidParamError, match="Requested prompt logprobs of 3"):
        llm.generate("Hello", SamplingParams(max_tokens=2, prompt_logprobs=3), use_tqdm=False)
    [again] = llm.generate("Hello", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)  # still serving
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_a_max_logprobs_above_the_vocabulary_caps_requests_at_the_vocabulary(tiny_model_dirs):
    """--max-logprobs larger than the vocabulary: a request asking for more logprobs than there are tokens is
    refused in vLLM's words at the vocabulary size, not taken into a step whose top-k then fails (in a server,
    the engine loop and every request with it)."""
    from flotilla.engine.llm import LLM

    vocab = json.loads((tiny_model_dirs["llama"] / "config.json").read_text())["vocab_size"]
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, device="cpu", max_logprobs=10 * vocab)
    with pytest.raises(InvalidParamError, match=f"Requested sample logprobs of {vocab + 1}, which is greater than "
                                                f"max allowed: {vocab}"):
        llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=vocab + 1), use_tqdm=False)
    with pytest.raises(InvalidParamError, match=f"Requested prompt logprobs of {vocab + 1}"):
        llm.generate("Hello there", SamplingParams(max_tokens=2, prompt_logprobs=vocab + 1), use_tqdm=False)
    [out] = llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=vocab, temperature=0), use_tqdm=False)
    assert all(len(entry) >= vocab for entry in out.outputs[0].logprobs)  # the whole vocabulary, as asked


def test_the_offline_sampling_params_take_minus_one_logprobs_as_vllms(tiny_model_dirs):
    """vLLM's SamplingParams takes logprobs and prompt_logprobs -1, every vocabulary entry: a count of the vocabulary
    size against --max-logprobs (served under --max-logprobs -1, else refused in vLLM's words, naming that size), as
    the server's chat top_logprobs / prompt_logprobs -1. Below -1 is refused in vLLM's words."""
    from flotilla.engine.llm import LLM

    vocab = json.loads((tiny_model_dirs["llama"] / "config.json").read_text())["vocab_size"]
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{field} must be non-negative or -1, got -2."):
            SamplingParams(**{field: -2})
    capped = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, device="cpu")
    with pytest.raises(InvalidParamError, match=f"Requested sample logprobs of {vocab}, which is greater than max "
                                                "allowed: 20"):
        capped.generate("Hello", SamplingParams(max_tokens=1, logprobs=-1), use_tqdm=False)
    with pytest.raises(InvalidParamError, match=f"Requested prompt logprobs of {vocab}, which is greater than max "
                                                "allowed: 20"):
        capped.generate("Hello", SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)
    whole = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, device="cpu", max_logprobs=-1)
    params = SamplingParams(max_tokens=2, logprobs=-1, prompt_logprobs=-1, temperature=0)
    [out] = whole.generate([1, 5, 9], params, use_tqdm=False)
    assert [len(entry) for entry in out.outputs[0].logprobs] == [vocab, vocab]
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert [len(entry) for entry in out.prompt_logprobs[1:]] == [vocab, vocab]
    assert params.logprobs == -1  # the caller's params are left as given


def test_max_log_len_cuts_each_prompt_of_an_embeddings_batch(caplog):
    from flotilla.engine.server.request_log import log_received

    caplog.set_level(logging.DEBUG, logger="flotilla.serve.requests")
    log_received("embd-cut", None, None, None, [[1, 2, 3, 4], [5, 6, 7]], 2)
    log_received("cmpl-cut", None, None, "abcdef", [1, 2, 3, 4], 3)
    assert "Request embd-cut prompt: None, prompt_token_ids: [[1, 2], [5, 6]]." in caplog.text
    assert "Request cmpl-cut prompt: 'abc', prompt_token_ids: [1, 2, 3]." in caplog.text


# `vllm serve`'s switches with a --no- form (argparse.BooleanOptionalAction in vLLM's arg_utils and frontend args);
# --disable-log-stats has none there either. The flags of spec fields (--calculate-kv-scales, --enable-lora) are
# left as they are: the operator renders a negatable switch's false as --no-X in every pod.
VLLM_NEGATABLE = ["--trust-remote-code", "--enforce-eager", "--disable-uvicorn-access-log",
                  "--return-tokens-as-token-ids", "--trust-request-chat-template", "--enable-request-id-headers",
                  "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                  "--exclude-tools-when-tool-choice-none", "--enable-server-load-tracking", "--allow-credentials",
                  "--enable-prefix-caching",
                  "--enable-chunked-prefill", "--async-scheduling", "--enable-log-requests", "--disable-log-requests"]


@pytest.mark.parametrize("name", VLLM_NEGATABLE)
def test_vllms_negated_switches_parse_as_vllm_serve_takes_them(name):
    """A manifest's --no-enforce-eager or --no-trust-remote-code was a usage error (and the operator's refusal of
    --enforce-eager=false suggested --no-enforce-eager, which it then refused as not an engine flag)."""
    dest = name[2:].replace("-", "_")
    assert getattr(build_parser().parse_args([f"--no-{name[2:]}"]), dest) is False
    assert getattr(build_parser().parse_args([name]), dest) is True

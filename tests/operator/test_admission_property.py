"""Property: whatever admission accepts, the engine's own parser and configuration accept.

Specs are drawn over the fields that become engine flags (including values near every rule's edge
and hostile engineArgs); for each one admission accepts, the rendered command line is parsed by the
real `flotilla serve` parser and built by `EngineConfig.from_kwargs` and `ServerConfig.from_kwargs`,
as the engine does at start-up, on CPU, against a model directory whose config.json carries the
numbers the spec declares (spec.model.config). Only model loading is left out.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flotilla.operator.admission import review
from flotilla.operator.engine_args import engine_args
from flotilla.operator.names import MODEL_PATH
from flotilla.operator.spec import InferenceServiceSpec

# The CRD's largest maxModelLen: a model of unknown length is assumed to allow any length the CRD allows.
CRD_MAX_MODEL_LEN = 10_485_760

EXTRA_ARGS = [["--seed", "3"], ["--seed", "-1"], ["--seed", "x"], ["--enforce-eager"], ["--async-scheduling"],
              ["--no-async-scheduling"], ["--disable-log-stats"], ["--shutdown-timeout", "2.5"],
              ["--shutdown-timeout", "-1"], ["--shutdown-timeout=4000"], ["--uvicorn-log-level", "debug"],
              ["--uvicorn-log-level", "loud"], ["--port", "1"], ["--host", "::"], ["--load-format", "dummy"],
              ["--load-format", "safetensors"],
              ["--device", "cpu"], ["--num-gpu-blocks-override", "1"], ["--help"], ["-h"], ["--"], ["stray"],
              ["--max-model-len", "16"], ["--enable-chunked-prefill"], ["--tokenizer", "/etc"],
              ["--structured-outputs-config", '{"disable_any_whitespace": true}'],
              ["--structured-outputs-config", '{"bogus": 1}'], ["--structured-outputs-config", "[1]"],
              ["--structured-outputs-config", '{"disable_any_whitespace": "yes"}'],
              ["--structured-outputs-config", '{"compile_timeout_s": 2.5}'],
              ["--structured-outputs-config", '{"compile_timeout_s": 0}'], ["--enable-auto-tool-choice"],
              ["--tool-call-parser", "hermes"],
              ["--override-generation-config", '{"temperature": 0.5, "max_new_tokens": 64, "do_sample": true}'],
              ["--override-generation-config", '{"top_p": 0}'], ["--override-generation-config", '"x"'],
              ["--override-generation-config", '{"max_new_tokens": 1.5}'],
              # config.json keys over the model's (a length override is left out: without spec.model.config the
              # webhook cannot know the length, which this test's config.json then sets to the CRD's largest)
              ["--hf-overrides", '{"rope_theta": 500000.0}'], ["--hf-overrides.rope_scaling.rope_type", "dynamic"],
              ["--hf-overrides", '{"rope_scaling": {"rope_type": "linear", "factor": 2.0}}'],
              ["--hf_overrides.torch_dtype", "int8"], ["--hf-overrides.torch_dtype", "float16"],
              # vLLM's underscore names
              ["--enforce_eager"], ["--max_model_len", "16"], ["--shutdown_timeout=2"]]
LENGTHS = st.one_of(st.none(), st.sampled_from([16, 17, 2048, 4096, 8192, 8193, 32768, 131072, 200000]),
                    st.integers(16, 300_000))


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    config = draw(st.one_of(st.none(), st.builds(
        lambda mpe: _drop_none({"hiddenSize": 2048, "numHiddenLayers": 16, "numAttentionHeads": 16,
                                "numKeyValueHeads": 4, "intermediateSize": 8192, "vocabSize": 32000,
                                "maxPositionEmbeddings": mpe}),
        st.one_of(st.none(), st.sampled_from([2048, 8192, 32768, 131072]), st.integers(16, 200_000)))))
    names = st.sampled_from(["chat", "--help", "-x", "a b", "llama-3.1:8b", "x\ty"])
    served = draw(st.one_of(st.none(), st.none(), names,
                            st.text(st.characters(codec="ascii"), min_size=1, max_size=12)))
    return _drop_none({
        "model": _drop_none({"source": "pvc://models/m", "servedName": served, "config": config}),
        "dtype": draw(st.sampled_from(["auto", "bfloat16", "float16", "float32"])),
        "resources": _drop_none({"gpuProduct": draw(st.sampled_from([None, "H200", "NVIDIA-L4"]))}),
        "parallelism": {"tensor": draw(st.sampled_from([1, 1, 1, 2])),
                        "pipeline": draw(st.sampled_from([1, 1, 1, 2]))},
        "kvCache": {"dtype": draw(st.sampled_from(["auto", "auto", "auto", "fp8"])),
                    "blockSize": draw(st.sampled_from([8, 16, 32, 64, 128])),
                    "gpuMemoryUtilization": draw(st.sampled_from([0.01, 0.5, 0.9, 1.0])),
                    "prefixCaching": draw(st.booleans())},
        "scheduling": _drop_none({"maxModelLen": draw(LENGTHS), "maxNumSeqs": draw(st.integers(1, 1024)),
                                  "maxNumBatchedTokens": draw(LENGTHS),
                                  "chunkedPrefill": draw(st.booleans())}),
        "engineArgs": [t for a in draw(st.one_of(st.just([]), st.lists(st.sampled_from(EXTRA_ARGS), max_size=3)))
                       for t in a],
    })


def _hf_config(spec: dict[str, Any]) -> dict[str, Any]:
    config = spec["model"].get("config") or {}
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
            "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 8192, "vocab_size": 32000,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": config.get("maxPositionEmbeddings", CRD_MAX_MODEL_LEN)}


@pytest.fixture(autouse=True)
def _no_api_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs())
def test_every_admitted_spec_starts_the_engine_configuration(spec: dict[str, Any]) -> None:
    from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
    from flotilla.engine.config import EngineConfig, ServerConfig
    from flotilla.engine.server.cli import build_parser

    result = review(spec, "svc")
    assume(not result.errors)
    assert result.spec is not None
    argv = engine_args(result.spec, "svc")
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(_hf_config(spec)))
        # the model's own argument only: a served name may be the same text ('/model')
        argv[argv.index(MODEL_PATH)] = model_dir
        args = build_parser().parse_args(argv)
        config = EngineConfig.from_kwargs(args.model, **flag_values(args, ENGINE_COMPONENTS))
        ServerConfig.from_kwargs(**flag_values(args, ("server",)))
    assert config.model.served_model_name == [spec["model"].get("servedName") or "svc"]


def test_the_strategy_reaches_both_sides_of_the_rules() -> None:
    """Guard against a vacuous property: the corpus drawn must hold admitted and refused specs alike."""
    admitted, refused = 0, 0

    @settings(max_examples=200, deadline=None, database=None)
    @given(spec=specs())
    def count(spec: dict[str, Any]) -> None:
        nonlocal admitted, refused
        if review(spec, "svc").errors:
            refused += 1
        else:
            admitted += 1

    count()
    assert admitted >= 30 and refused >= 30, (admitted, refused)


# A tiny llama GGUF's numbers (tests/engine/gguf_files.py defaults), as spec.model.config states them.
TINY_GGUF = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2,
             "intermediateSize": 128, "vocabSize": 256, "maxPositionEmbeddings": 512}


def _engine_config(argv: list[str], model: str) -> Any:
    from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.server.cli import build_parser

    args = build_parser().parse_args([model, *argv[1:]])
    return EngineConfig.from_kwargs(args.model, **flag_values(args, ENGINE_COMPONENTS))


@pytest.mark.parametrize("fields", [{}, {"quantization": "gguf"}, {"parallelism": {"tensor": 2}},
                                    {"dtype": "float32", "speculative": {"method": "ngram"}},
                                    {"lora": {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}},
                                    {"model": {"source": "pvc://models/gguf/tiny.Q4_0.gguf", "config": TINY_GGUF,
                                               "tokenizer": "pvc://models/tiny"}}])
def test_an_admitted_gguf_spec_starts_the_engine_configuration_on_a_gguf_file(tmp_path, fields):
    """A .gguf source as admitted renders `/model/<file> --quantization gguf ...`; the engine's parser and
    configuration accept it on a real GGUF file (its config read from the file by transformers), and what the
    webhook refuses of a GGUF model the engine refuses too."""
    from flotilla.engine.config import ConfigError

    from ..engine.gguf_files import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "tiny.Q4_0.gguf", 256)
    spec = {"model": {"source": "pvc://models/gguf/tiny.Q4_0.gguf", "config": TINY_GGUF}, **fields}
    tokenizer = "/tokenizer" if "tokenizer" in spec["model"] else str(path)
    result = review(spec, "svc")
    assert result.errors == [] and result.spec is not None
    argv = engine_args(result.spec, "svc")
    assert argv[0] == "/model/tiny.Q4_0.gguf"
    config = _engine_config(argv, str(path))
    assert config.model.quantization == "gguf" and config.model.model == str(path)
    assert config.model.tokenizer == tokenizer
    assert config.lora.enable_lora == ("lora" in spec)
    # The same spec naming a directory: refused at admission, and by the engine.
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").write_text(json.dumps(_hf_config({"model": {"config": TINY_GGUF}})))
    directory = {**spec, "model": {**spec["model"], "source": "pvc://models/dir"}, "quantization": "gguf"}
    refused = review(directory, "svc")
    assert refused.errors and refused.errors[0].startswith("spec.quantization: gguf serves one .gguf file")
    with pytest.raises(ConfigError, match="is not a .gguf file"):
        _engine_config(engine_args(InferenceServiceSpec.model_validate(directory), "svc"), str(tmp_path / "dir"))
    # A .gguf file with another quantization: refused at admission, and by the engine.
    fp8 = review({**spec, "quantization": "fp8"}, "svc")
    assert fp8.errors and "serves its own quantized weights" in fp8.errors[0]
    with pytest.raises(ConfigError, match="serves its own quantized weights"):
        _engine_config(engine_args(InferenceServiceSpec.model_validate({**spec, "quantization": "fp8"}), "svc"),
                       str(path))

"""Spec -> engine command line, and the refusal of flags the engine does not implement yet."""

from __future__ import annotations

import json

import pytest

from flotilla.flags import FLAGS, flag
from flotilla.operator.deployment import build_deployment
from flotilla.operator.engine_args import (
    ENGINE_ARGS_ALLOWED,
    FIELD_VALUES,
    OPERATOR_OWNED,
    engine_args,
    engine_args_errors,
    shutdown_timeout,
    unsupported,
)
from flotilla.operator.exec_size import MAX_ARG_BYTES, argument_length_problems
from flotilla.operator.spec import InferenceServiceSpec


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, **spec})


def flag_value(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("quantization", ["none", "gguf"])
def test_a_gguf_file_is_the_model_and_renders_quantization_gguf(quantization):
    """The engine implies --quantization gguf from a .gguf model; the operator renders it either way, so the pod
    spec shows what runs, and the webhook's engine rules see it."""
    spec = make(model={"source": "pvc://models/gguf/llama.Q4_1.gguf"}, quantization=quantization)
    args = engine_args(spec, "llama")
    assert args[0] == "/model/llama.Q4_1.gguf"
    assert flag_value(args, "--quantization") == "gguf"
    assert "--tokenizer" not in args  # the engine rebuilds the tokenizer from the file
    assert unsupported(spec, "llama") == []
    assert flag_value(engine_args(make(), "llama"), "--quantization") is None


def test_a_tokenizer_source_is_mounted_and_passed_as_tokenizer():
    spec = make(model={"source": "pvc://models/gguf/llama.Q4_1.gguf", "tokenizer": "pvc://models/llama"})
    assert flag_value(engine_args(spec, "llama"), "--tokenizer") == "/tokenizer"
    assert unsupported(spec, "llama") == []


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
    ({"quantization": "rtn"}, "--quantization", "rtn"),
    ({"parallelism": {"tensor": 2}}, "--tensor-parallel-size", "2"),
    ({"parallelism": {"pipeline": 2}}, "--pipeline-parallel-size", "2"),
    ({"runner": "pooling"}, "--runner", "pooling"),
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


def test_calculated_kv_scales_render_as_a_switch_and_need_an_fp8_cache():
    assert "--calculate-kv-scales" in engine_args(make(kvCache={"dtype": "fp8", "calculateScales": True}), "x")
    assert "--calculate-kv-scales" not in engine_args(make(kvCache={"dtype": "fp8"}), "x")
    assert unsupported(make(kvCache={"calculateScales": True}), "x") == [
        "spec.kvCache.calculateScales computes the scales of an fp8 KV cache: set spec.kvCache.dtype fp8 with "
        "it, or leave it out"]


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
    "kvCache.calculateScales": {"kvCache": {"dtype": "fp8", "calculateScales": True}},
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


OWNED = "spec.engineArgs: {} is set by the operator: "


@pytest.mark.parametrize(("extra", "error"), [
    (["--enforce-eager"], None),
    (["--seed", "3"], None),
    (["--seed=3"], None),
    (["--seed", "-3"], None),  # a negative number is a value, as argparse reads it
    (["--no-async-scheduling", "--disable-log-stats"], None),
    (["--shutdown-timeout", "120"], None),
    (["--shutdown-timeout=2.5"], None),
    (["--uvicorn-log-level", "debug"], None),
    (["--triton-gemv-max-rows", "0"], None),
    (["--triton-gemv-max-rows", "9"], "spec.engineArgs: --triton-gemv-max-rows=9 is out of range (>= 0 and <= 8)"),
    (["--max-request-body-size", "0"], "spec.engineArgs: --max-request-body-size=0 is out of range (>= 1)"),
    (["--bogus"], "spec.engineArgs: --bogus is not an engine flag"),
    (["--max-model-len", "4096"], "spec.engineArgs: --max-model-len is set by spec.scheduling.maxModelLen; "
                                  "set that field instead"),
    (["-tp", "2"], "spec.engineArgs: --tensor-parallel-size is set by spec.parallelism.tensor; "
                   "set that field instead"),
    (["--served-model-name", "x"], "spec.engineArgs: --served-model-name is set by spec.model.servedName; "
                                   "set that field instead"),
    (["--api-key", "k"], "spec.engineArgs: --api-key is set by spec.apiKeySecretRef; set that field instead"),
    # Flags the operator owns: each would break probes, serve other weights or bypass the fit check.
    (["--port", "9000"], OWNED.format("--port") + "the probes, the Service and the ServiceMonitor reach the "
                                                  "engine on port 8000"),
    (["--host", "0.0.0.0"], OWNED.format("--host") + "the probes and the Service reach the engine on every pod "
                                                     "address"),
    (["--host=127.0.0.1"], OWNED.format("--host") + "the probes and the Service reach the engine on every pod "
                                                    "address"),
    (["--load-format", "dummy"], "spec.engineArgs: --load-format dummy is the operator's to refuse: the weights come "
                                 "from spec.model.source (dummy would serve random weights); it may be auto or "
                                 "safetensors"),
    # vLLM manifests' --load-format safetensors loads spec.model.source's weights, as the engine's auto does.
    (["--load-format", "safetensors"], None),
    (["--load-format=auto"], None),
    (["--device", "cpu"], OWNED.format("--device") + "engine pods run on the GPUs they request"),
    (["--num-gpu-blocks-override", "1"], OWNED.format("--num-gpu-blocks-override")
     + "the KV cache is sized by spec.kvCache.gpuMemoryUtilization, which the fit check reads"),
    (["--tokenizer", "/etc"], "spec.engineArgs: --tokenizer is set by spec.model.tokenizer; set that field instead"),
    # Values by the contract's types and ranges; the grammar as strict as the engine's parser.
    (["--seed", "abc"], "spec.engineArgs: --seed: 'abc' is not a valid int"),
    (["--seed", "1.5"], "spec.engineArgs: --seed: '1.5' is not a valid int"),
    (["--shutdown-timeout", "-1"], "spec.engineArgs: --shutdown-timeout=-1.0 is out of range (>= 0 and <= 3600)"),
    (["--shutdown-timeout", "1e18"], "spec.engineArgs: --shutdown-timeout=1e+18 is out of range (>= 0 and <= 3600)"),
    (["--shutdown-timeout", "nan"], "spec.engineArgs: --shutdown-timeout: 'nan' is not a valid float"),
    (["--shutdown-timeout", "inf"], "spec.engineArgs: --shutdown-timeout: 'inf' is not a valid float"),
    (["--shutdown-timeout"], "spec.engineArgs: --shutdown-timeout needs a value"),
    (["--uvicorn-log-level", "loud"], "spec.engineArgs: --uvicorn-log-level='loud' is not one of: critical, "
                                      "error, warning, info, debug, trace"),
    (["--enforce-eager=false"], "spec.engineArgs: --enforce-eager takes no value (use --enforce-eager or "
                                "--no-enforce-eager)"),
    (["--no-enforce-eager"], None),  # vLLM's form, which the refusal above suggests
    (["--no-trust-remote-code"], None),
    (["--disable-log-stats=true"], "spec.engineArgs: --disable-log-stats takes no value (use --disable-log-stats "
                                   "alone, or leave it out)"),  # no --no- form, in vLLM either
    (["--seed", "1", "--seed", "2"], "spec.engineArgs: --seed is given more than once"),
    (["stray"], "spec.engineArgs: 'stray' is not a flag (a value must follow its flag)"),
    (["--seed", "1", "extra"], "spec.engineArgs: 'extra' is not a flag (a value must follow its flag)"),
    (["--por", "9000"], "spec.engineArgs: --por is not an engine flag"),  # argparse would take it for --port
    (["--", "--port", "9000"], "spec.engineArgs: -- is not an engine flag"),
    # The owner's chat template as its text; a path would have the engine read a file of its pod into prompts.
    (["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"], None),
    (["--chat-template", "Human: {{ messages[0].content }}\nAssistant:"], None),
    (["--chat-template", "/proc/self/environ"], "spec.engineArgs: --chat-template must be the template's text "
                                                "(holding {, } or a newline), not a file path: the operator lets the "
                                                "engine read no file of its pod into prompts; put the file's text in "
                                                "the value"),
    (["--default-chat-template-kwargs", '{"enable_thinking": false}'], None),
    # How prefix-cache keys are computed: the owner's choice, among the engine's algorithms.
    (["--prefix-caching-hash-algo", "builtin"], None),
    (["--prefix-caching-hash-algo", "md5"], "spec.engineArgs: --prefix-caching-hash-algo='md5' is not one of: "
                                            "sha256, builtin, sha256_cbor, xxhash, xxhash_cbor"),
    # vLLM's newer algorithms: named, but their keys are not computed here.
    (["--prefix-caching-hash-algo", "xxhash"], "spec.engineArgs: --prefix-caching-hash-algo='xxhash' is not "
                                               "supported yet (supported: sha256, builtin)"),
    # What vLLM manifests carry: a per-request logprobs bound, request log lines, remote code (never run here).
    (["--max-logprobs", "5", "--enable-log-requests", "--trust-remote-code"], None),
    (["--max-logprobs", "-1", "--disable-log-requests"], None),
    (["--enable-log-requests", "--no-disable-log-requests"], None),  # vLLM's negation of its older spelling
    (["--max-logprobs", "-2"], "spec.engineArgs: --max-logprobs=-2 is out of range (>= -1)"),
    # More of what vLLM manifests carry: the request log's prompt length, uvicorn's access log (a line per request),
    # the chat reply's role, logprobs' token ids by default, the tokenizer modes loaded here; the Hub download flags
    # are the operator's.
    (["--max-log-len", "100", "--disable-uvicorn-access-log", "--response-role", "bot", "--return-tokens-as-token-ids",
      "--tokenizer-mode", "hf"], None),
    (["--max-log-len", "-1"], "spec.engineArgs: --max-log-len=-1 is out of range (>= 0)"),
    (["--tokenizer-mode", "mistral"], "spec.engineArgs: --tokenizer-mode='mistral' is not supported yet (supported: "
                                      "auto, hf): the tokenizer is loaded only as vLLM's auto and hf modes load it "
                                      "(Hugging Face's, fast where the model has one)"),
    (["--revision", "v2"], OWNED.format("--revision") + "it downloads spec.model.source into the pod (the engine "
                                                        "reads local directories only); pin the revision there: "
                                                        "hf://org/name:revision"),
    (["--download-dir", "/cache"], OWNED.format("--download-dir") + "it downloads spec.model.source into the pod's "
                                                                    "model volume; the engine reads local directories "
                                                                    "only"),
    (["--tokenizer-revision", "v2"], OWNED.format("--tokenizer-revision") + "it downloads spec.model.source (and "
                                     "spec.model.tokenizer) into the pod (the engine reads local directories only); "
                                     "pin the revision there: hf://org/name:revision"),
    # config.json keys over the model's: only that dict changes, its values checked by the engine's rules
    (["--hf-overrides", '{"max_position_embeddings": 8192, "rope_theta": 1e6}'], None),
    (["--hf_overrides.rope_scaling.rope_type", "yarn", "--hf-overrides.rope_scaling.factor", "4"], None),
    (["--hf-overrides", '{"rope_scaling": {"rope_type": "dynamic", "factor": 2}}'],
     'spec.engineArgs: --hf-overrides: rope_scaling: rope type "dynamic" is not one the engine computes (default, '
     "linear, llama3, yarn)"),
    # a rope type that is no string was a TypeError (unhashable) inside the webhook
    (["--hf-overrides", '{"rope_scaling": {"rope_type": ["yarn"]}}'],
     'spec.engineArgs: --hf-overrides: rope_scaling: rope type ["yarn"] is not one the engine computes (default, '
     "linear, llama3, yarn)"),
    (["--hf-overrides.torch_dtype", "int8"],
     'spec.engineArgs: --hf-overrides: torch_dtype must be one of bfloat16, float16, float32, not "int8"'),
    (["--hf-overrides", '{"num_hidden_layers": "x"}'],
     'spec.engineArgs: --hf-overrides: num_hidden_layers must be a positive integer, not "x"'),
    (["--hf-overrides", "[1]"], "spec.engineArgs: --hf-overrides must be a JSON object of config.json keys, not [1]"),
    # vLLM's underscore names are the dashed flags, owned or allowed as those are (flotilla/underscore_flags.py)
    (["--enforce_eager", "--seed=1", "--max_log_len", "10"], None),
    (["--max_model_len", "4096"], "spec.engineArgs: --max-model-len is set by spec.scheduling.maxModelLen; set that "
                                  "field instead"),
    (["--ssl_certfile=/c.pem"], OWNED.format("--ssl-certfile") + "the probes, the Service and the ServiceMonitor "
                                "speak plain HTTP to the engine; terminate TLS at the gateway or a service mesh "
                                "(docs/server.md)"),
    # vLLM's compilation settings as far as they set the CUDA graphs; a key with no meaning here is refused.
    (["-O0", "--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4, 8]}'], None),
    # vLLM's dotted keys, read as the engine's parser reads them (flotilla/dotted_args.py)
    (["-O0", "-cc.cudagraph_capture_sizes", "[1, 2, 4, 8]"], None),
    (["--speculative-config.method", "ngram"], "spec.engineArgs: --speculative-config is set by spec.speculative; "
                                               "set that field instead"),
    (["--port.x", "1"], "spec.engineArgs: --port takes no dotted keys: only a flag whose value is a JSON object does "
                        "(--compilation-config, --default-chat-template-kwargs, --hf-overrides, "
                        "--override-generation-config, --speculative-config, --structured-outputs-config)"),
    # flags vLLM removed: refused saying so, as the engine refuses them (flotilla/removed_flags.py)
    (["--guided-decoding-backend", "xgrammar"], "spec.engineArgs: --guided-decoding-backend is not a flag of today's "
     "vLLM: vLLM removed the --guided-decoding-* flags (its PR 22772, release 0.10.2) for --structured-outputs-config; "
     "give --structured-outputs-config.backend VALUE (or the same key in --structured-outputs-config's JSON)"),
    (["--enable-force-include-usage"], None),
    # vLLM manifests' probe and scrape paths without access lines carry over: only this pod's log changes.
    (["--disable-access-log-for-endpoints", "/health,/metrics,/ping"], None),
    # Client certificates: the probes and the scrape speak plain HTTP and show none.
    (["--ssl-cert-reqs", "2"], OWNED.format("--ssl-cert-reqs") + "the probes, the Service and the ServiceMonitor "
     "speak plain HTTP to the engine, and show no client certificate; verify clients at the gateway or a service "
     "mesh (docs/server.md)"),
    # vLLM takes auto only for --max-model-len; this one's refusal names its own flag.
    (["--max-num-batched-tokens", "auto"], "spec.engineArgs: --max-num-batched-tokens: 'auto' is not a valid int"),
    (["--model", "/elsewhere"], OWNED.format("--model") + "it serves spec.model.source"),
    (["--model=/elsewhere", "--seed", "1"], OWNED.format("--model") + "it serves spec.model.source"),
])
def test_engine_args_are_checked_against_the_flag_contract(extra, error):
    errors = engine_args_errors(extra)
    if error is None:
        assert errors == []
    else:
        assert errors[0] == error


ARCH = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "intermediateSize": 128, "vocabSize": 256,
        "maxPositionEmbeddings": 4096}


def test_hf_overrides_set_over_model_config_are_the_length_the_webhook_checks():
    # the engine derives its length from config.json with the overrides set over it; so does the webhook
    yarn = '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}'
    spec = make(model={"source": "pvc://models/m", "config": ARCH}, scheduling={"maxModelLen": 16384},
                engineArgs=["--hf-overrides", yarn])
    assert spec.architecture is not None and spec.architecture.length_limit == 16384
    assert unsupported(spec, "x") == []
    shorter = make(model={"source": "pvc://models/m", "config": ARCH}, scheduling={"maxModelLen": 4096},
                   engineArgs=["--hf_overrides.max_position_embeddings", "2048"])
    assert [e for e in unsupported(shorter, "x") if "4096" in e and "2048" in e]
    assert make(model={"source": "pvc://models/m", "config": ARCH}).architecture.length_limit == 4096


def test_hf_overrides_set_only_config_json_keys_over_model_config():
    # numParameters and weightBits are the spec's own numbers, not config.json keys (the engine ignores such an
    # override): an override of them must not make the fit check count another model
    stated = {**ARCH, "numParameters": 7_000_000_000}
    spec = make(model={"source": "pvc://models/m", "config": stated},
                engineArgs=["--hf-overrides", '{"num_parameters": 1, "weight_bits": 4}'])
    assert spec.architecture.num_parameters == 7_000_000_000 and spec.architecture.weight_bits is None
    # Mixtral's expert count is num_local_experts, which the engine reads first (engine_rules.moe_num_experts)
    moe = make(model={"source": "pvc://models/m", "config": {**ARCH, "numExperts": 8}},
               engineArgs=["--hf-overrides", '{"num_local_experts": 4}'])
    assert moe.architecture.num_experts == 4


@pytest.mark.parametrize(("quantization", "override", "error"), [
    ("none", {"quant_method": "gptq", "bits": 4}, None),
    ("gptq", {"quant_method": "GPTQ", "bits": 8}, None),
    ("none", {"quant_method": "gguf"}, None),  # read as no scheme by the engine: the weights load as they are
    ("fp8", {"quant_method": "compressed-tensors"},
     "spec.engineArgs: --hf-overrides: quantization_config's quant_method 'compressed-tensors' does not match "
     "spec.quantization fp8; the engine refuses to start with both: leave spec.quantization out or make them agree"),
    ("none", {"quant_method": "hqq"},
     "spec.engineArgs: --hf-overrides: quantization_config's quant_method 'hqq' is not one the engine loads "
     "a checkpoint with (supported: fp8, compressed-tensors, gptq, awq, bitsandbytes, modelopt, fbgemm_fp8)"),
    ("none", {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, None),
    ("none", {"quant_method": "bitsandbytes", "load_in_8bit": True},
     "spec.engineArgs: --hf-overrides: quantization_config: bitsandbytes with 8-bit weights is not supported (4 "
     "bits)"),
    # NVIDIA ModelOpt and Meta fbgemm fp8 checkpoints: what the engine runs, and its refusals in its words
    ("none", {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, None),
    ("none", {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]},
     None),
    ("none", {"quant_method": "modelopt", "quant_algo": "NVFP4"},
     "spec.engineArgs: --hf-overrides: quantization_config: modelopt quant_algo 'NVFP4' is not supported; FP8 "
     "(per-tensor e4m3 weights, static input scales) and FP8_PER_CHANNEL_PER_TOKEN are"),
    ("fp8", {"quant_method": "modelopt", "quant_algo": "FP8"},
     "spec.engineArgs: --hf-overrides: quantization_config's quant_method 'modelopt' does not match "
     "spec.quantization fp8; the engine refuses to start with both: leave spec.quantization out or make them agree"),
    ("none", {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
              "modules_to_not_convert": ["model.layers.3.self_attn.o_proj"]},
     "spec.engineArgs: --hf-overrides: quantization_config: fbgemm_fp8 checkpoints with unquantized decoder layers "
     "(modules_to_not_convert ['model.layers.3.self_attn.o_proj']) are not supported; only the LM head may be left "
     "out"),
    ("none", {"quant_method": "awq", "bits": 8},
     "spec.engineArgs: --hf-overrides: quantization_config: awq with 8-bit weights is not supported (4 bits)"),
    # bits read as the engine's int(): true is 1 bit (refused), "8" is 8, text is no number (refused)
    ("none", {"quant_method": "gptq", "bits": True},
     "spec.engineArgs: --hf-overrides: quantization_config: gptq with 1-bit weights is not supported (4 or 8 "
     "bits)"),
    ("none", {"quant_method": "gptq", "bits": "8"}, None),
    ("none", {"quant_method": "awq", "w_bit": "four"},
     "spec.engineArgs: --hf-overrides: quantization_config: awq's bits 'four' is not a number of bits"),
    ("none", {"quant_method": "gptq", "group_size": None},
     "spec.engineArgs: --hf-overrides: quantization_config: gptq's group_size None is not a number of inputs"),
    ("none", {"quant_method": "compressed-tensors", "config_groups": {"a": {}, "b": {}}},
     "spec.engineArgs: --hf-overrides: quantization_config: compressed-tensors: 2 config groups; one group over the "
     "linear layers is supported"),
    ("none", {"quant_method": None}, None),  # a null quant_method names no scheme, as an absent one
    ("none", {"bits": 4}, None),  # no quant_method: the weights load as they are
    # ... but beside a scheme it is a mismatch, as vLLM's config check (and the engine's resolve_quantization) has it
    ("fp8", {"bits": 4},
     "spec.engineArgs: --hf-overrides: quantization_config has no quant_method, which does not match "
     "spec.quantization fp8; the engine refuses to start with both: leave spec.quantization out or name the scheme "
     "in quant_method"),
    ("gptq", {"quant_method": ""},
     "spec.engineArgs: --hf-overrides: quantization_config has no quant_method, which does not match "
     "spec.quantization gptq; the engine refuses to start with both: leave spec.quantization out or name the scheme "
     "in quant_method"),
])
def test_a_quantization_config_override_is_refused_where_the_engine_refuses_it(quantization, override, error):
    spec = make(model={"source": "pvc://models/m", "config": ARCH}, quantization=quantization,
                engineArgs=["--hf-overrides", json.dumps({"quantization_config": override})])
    assert unsupported(spec, "x") == ([] if error is None else [error])


@pytest.mark.parametrize("override", [{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
                                      {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                       "config_groups": {"g": {"targets": ["Linear"], "weights": {
                                           "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                                           "actorder": "group"}}}}])
def test_an_activation_order_override_is_admitted_on_one_tensor_rank_only(override):
    """The engine sorts an activation-order layer's inputs by group (engine/quantization/packed_int.py) but not over
    tensor-parallel ranks, which split o_proj's and down_proj's inputs: refused there in the engine's words."""
    args = ["--hf-overrides", json.dumps({"quantization_config": override})]
    one = make(model={"source": "pvc://models/m", "config": ARCH}, engineArgs=args)
    assert unsupported(one, "x") == []
    two = make(model={"source": "pvc://models/m", "config": ARCH}, engineArgs=args,
               parallelism={"tensor": 2}, resources={"gpusPerReplica": 2})
    assert unsupported(two, "x") == [
        f"spec.engineArgs: --hf-overrides: quantization_config: {override['quant_method']} activation-order "
        "checkpoints (desc_act: true / actorder group: groups of permuted inputs, g_idx) run with "
        "spec.parallelism.tensor 1 only, not 2: the row-parallel layers would split the permuted inputs over the "
        "ranks (pipeline parallelism runs them)"]


def test_the_fit_check_counts_a_modelopt_override_as_the_engine_holds_it():
    """ModelOpt FP8 over --hf-overrides: 1 byte a weight (as fp8), plus a float32 input scale a linear layer, and with
    kv_cache_quant_algo FP8 an fp8 KV cache under kvCache.dtype auto, as the engine reads it."""
    from flotilla.operator.fit import check_fit

    def report(qcfg):
        return check_fit(make(model={"source": "pvc://models/m", "config": ARCH}, resources={"gpuProduct": "H100"},
                              engineArgs=["--hf-overrides", json.dumps({"quantization_config": qcfg})]))

    plain = report({"quant_method": "modelopt", "quant_algo": "FP8"})
    fp8_kv = report({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})
    fp8 = check_fit(make(model={"source": "pvc://models/m", "config": ARCH}, resources={"gpuProduct": "H100"},
                         quantization="fp8"))
    assert plain.weight_bytes - fp8.weight_bytes == 4 * 4 * ARCH["numHiddenLayers"]
    assert 2 * fp8_kv.kv_bytes_per_token == plain.kv_bytes_per_token == fp8.kv_bytes_per_token


def test_hf_overrides_are_parsed_once_per_spec(monkeypatch):
    # the webhook, the fit check and the Deployment each read the override several times (architecture, the
    # quantization_config, weight_quantization): one parse of engineArgs serves them all, with the same answers
    import flotilla.operator.spec as spec_module
    from flotilla.operator.fit import check_fit

    calls = []
    parse = spec_module.engine_args_hf_overrides
    monkeypatch.setattr(spec_module, "engine_args_hf_overrides", lambda args: calls.append(args) or parse(args))
    override = {"quantization_config": {"quant_method": "gptq", "bits": 8}, "max_position_embeddings": 4096}
    spec = make(model={"source": "pvc://models/m", "config": ARCH}, resources={"gpuProduct": "H100"},
                engineArgs=["--hf-overrides", json.dumps(override)])
    assert unsupported(spec, "x") == []
    report = check_fit(spec)
    build_deployment(spec, "x", "ns")
    assert (spec.weight_quantization, spec.architecture.weight_bits, spec.architecture.max_position_embeddings) == \
        ("gptq", 8, 4096)
    assert spec.quantization_config_override == override["quantization_config"] and report.verdict == "Fits"
    assert len(calls) == 1
    assert make(engineArgs=["--hf-overrides", "{}"]).hf_overrides == {} and len(calls) == 2  # another spec: its own


def test_hf_overrides_beyond_model_configs_bounds_are_refused():
    spec = make(model={"source": "pvc://models/m", "config": ARCH},
                engineArgs=["--hf-overrides", '{"max_position_embeddings": 2147483647}'])
    assert spec.architecture == spec.model.config  # as stated: the webhook refuses the spec
    assert unsupported(spec, "x") == ["spec.engineArgs: --hf-overrides set over spec.model.config: "
                                      "max_position_embeddings: Input should be less than or equal to 1073741824"]


def test_the_uni_executor_is_refused_beside_parallel_ranks_as_the_engine_refuses_it():
    assert unsupported(make(engineArgs=["--distributed-executor-backend", "uni"]), "x") == []
    assert unsupported(make(parallelism={"tensor": 2}, engineArgs=["--distributed-executor-backend", "uni"]), "x") == [
        "--distributed-executor-backend uni runs the model in the engine's own process, one rank; "
        "spec.parallelism.tensor 2 x spec.parallelism.pipeline 1 ranks run as worker processes: use mp (or leave it "
        "out)"]


def test_a_compilation_key_with_no_meaning_here_is_refused_as_the_engine_refuses_it():
    assert unsupported(make(engineArgs=["-O0", "-cc", '{"cudagraph_capture_sizes": [1, 2]}']), "x") == []
    assert unsupported(make(engineArgs=["-cc.cudagraph_mode", "piecewise"]), "x") == [
        "--compilation-config: cudagraph_mode PIECEWISE is not supported: graphs here capture whole steps, attention "
        "included (vLLM's FULL); none are captured piecewise"]
    assert unsupported(make(engineArgs=["--compilation-config", '{"backend": "inductor"}']), "x") == [
        "--compilation-config: backend: not a key this engine maps (it takes cudagraph_capture_sizes, "
        "max_cudagraph_capture_size, max_capture_size, cudagraph_mode, level, mode): nothing is compiled with "
        "torch.compile here, and the CUDA graphs are all these set"]


def test_both_request_log_flags_are_refused_as_the_engine_refuses_them():
    assert unsupported(make(engineArgs=["--enable-log-requests"]), "x") == []
    assert unsupported(make(engineArgs=["--enable-log-requests", "--disable-log-requests"]), "x") == [
        "--enable-log-requests and --disable-log-requests contradict each other: give one"]


def test_load_format_safetensors_is_refused_for_a_gguf_model_as_the_engine_refuses_it():
    gguf = {"source": "pvc://models/gguf/llama.Q4_1.gguf"}
    assert unsupported(make(model=gguf, engineArgs=["--load-format", "auto"]), "x") == []
    assert unsupported(make(model=gguf, engineArgs=["--load-format", "safetensors"]), "x") == [
        "spec.engineArgs: --load-format safetensors reads an HF directory's .safetensors files; a .gguf model is read "
        "from its own file (leave --load-format out)"]
    assert unsupported(make(engineArgs=["--load-format", "safetensors"]), "x") == []


def test_a_draft_model_beside_parallel_workers_is_refused_as_the_engine_refuses_it():
    draft = {"method": "draft_model", "draftModel": "pvc://models/d"}
    assert unsupported(make(speculative=draft), "x") == []
    assert unsupported(make(speculative=draft, parallelism={"tensor": 2}), "x") == [
        "spec.speculative with a draft model runs on one GPU, not beside tensor or pipeline parallelism yet: use the "
        "ngram method, or set spec.parallelism.tensor and spec.parallelism.pipeline to 1"]
    assert unsupported(make(speculative={"method": "ngram"}, parallelism={"pipeline": 2}), "x") == []


def test_a_draft_model_shorter_than_the_length_served_is_refused_as_the_engine_refuses_it():
    arch = {"hiddenSize": 2048, "numHiddenLayers": 16, "numAttentionHeads": 16, "numKeyValueHeads": 4,
            "intermediateSize": 8192, "vocabSize": 32000}
    draft = {"method": "draft_model", "draftModel": "/model/draft",
             "draftConfig": {**arch, "maxPositionEmbeddings": 2048}}
    target = {"source": "pvc://models/m", "config": {**arch, "maxPositionEmbeddings": 8192}}
    # maxModelLen unset: the length served is the model's own
    assert unsupported(make(model=target, speculative=draft), "x") == [
        "spec.speculative: the draft model has positions for 2048 tokens "
        "(spec.speculative.draftConfig.maxPositionEmbeddings), fewer than the target model's length 8192, which is "
        "served while spec.scheduling.maxModelLen is unset; set spec.scheduling.maxModelLen to 2048 or use a draft "
        "model with a context at least that long"]
    assert unsupported(make(model=target, speculative=draft, scheduling={"maxModelLen": 4096}), "x") == [
        "spec.speculative: the draft model has positions for 2048 tokens "
        "(spec.speculative.draftConfig.maxPositionEmbeddings), fewer than spec.scheduling.maxModelLen 4096; lower "
        "spec.scheduling.maxModelLen to 2048 or use a draft model with a context at least that long"]
    # rope-scaled positions name the numbers they come from
    yarn = {**draft, "draftConfig": {**arch, "maxPositionEmbeddings": 1024, "ropeScaling": {
        "type": "yarn", "factor": 2.5, "originalMaxPositionEmbeddings": 1024}}}
    assert unsupported(make(model=target, speculative=yarn, scheduling={"maxModelLen": 4096}), "x") == [
        "spec.speculative: the draft model has positions for 2560 tokens (spec.speculative.draftConfig.ropeScaling."
        "originalMaxPositionEmbeddings 1024 x ropeScaling.factor 2.5), fewer than spec.scheduling.maxModelLen 4096; "
        "lower spec.scheduling.maxModelLen to 2560 or use a draft model with a context at least that long"]
    top = {**draft, "draftConfig": {**arch, "maxPositionEmbeddings": 1024, "originalMaxPositionEmbeddings": 512,
                                    "ropeScaling": {"type": "yarn", "factor": 4.0,
                                                    "originalMaxPositionEmbeddings": 1024}}}
    assert unsupported(make(model=target, speculative=top, scheduling={"maxModelLen": 4096}), "x") == [
        "spec.speculative: the draft model has positions for 2048 tokens (spec.speculative.draftConfig."
        "originalMaxPositionEmbeddings 512 x ropeScaling.factor 4), fewer than spec.scheduling.maxModelLen 4096; "
        "lower spec.scheduling.maxModelLen to 2048 or use a draft model with a context at least that long"]
    assert unsupported(make(model=target, speculative=draft, scheduling={"maxModelLen": 2048}), "x") == []
    assert unsupported(make(speculative=draft), "x") == []  # the length served is not known here: the engine checks


def test_every_flag_is_classified_for_engine_args():
    # A new flag must be decided on (a CRD field, owned by the operator, or allowed) before release;
    # until then engineArgs refuses it, and this test says so.
    unclassified = [f.name for f in FLAGS
                    if not f.crd_field and f.name not in OPERATOR_OWNED and f.name not in ENGINE_ARGS_ALLOWED]
    assert unclassified == []


def test_every_classified_flag_exists_and_no_flag_is_both_owned_and_allowed():
    names = {f.name for f in FLAGS}
    assert set(OPERATOR_OWNED) <= names
    assert set(ENGINE_ARGS_ALLOWED) <= names
    assert not set(OPERATOR_OWNED) & ENGINE_ARGS_ALLOWED
    assert not {f.name for f in FLAGS if f.crd_field} & (set(OPERATOR_OWNED) | ENGINE_ARGS_ALLOWED)


@pytest.mark.parametrize(("extra", "grace"), [([], 10 + 30 + 15), (["--shutdown-timeout", "600"], 10 + 600 + 15),
                                              (["--shutdown-timeout=2.5"], 10 + 3 + 15)])
def test_shutdown_timeout_sets_the_pods_grace_period(extra, grace):
    spec = make(engineArgs=extra)
    assert shutdown_timeout(spec) == float(extra[-1].split("=")[-1]) if extra else 30.0
    assert build_deployment(spec, "x", "ns")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace


def test_runner_field_is_validated_and_owns_the_runner_flags():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="runner"):
        make(runner="classify")
    assert flag_value(engine_args(make(), "x"), "--runner") == "auto"
    errors = engine_args_errors(["--task", "embed", "--convert", "embed", "--runner", "pooling"])
    assert any("--task" in e and "spec.runner" in e for e in errors)
    assert any("--convert" in e and "spec.runner" in e for e in errors)
    assert any("--runner is set by spec.runner" in e for e in errors)
    assert unsupported(make(runner="pooling"), "x") == []


@pytest.mark.parametrize(("args", "refused"), [
    (["--chat-template", "{{ m }}" + "a" * (MAX_ARG_BYTES - 8)], []),  # 131,071 bytes and the NUL: Linux starts it
    (["--chat-template", "{{ m }}" + "a" * (MAX_ARG_BYTES - 7)], [1]),
    (["--enforce-eager", "--chat-template=" + "{{ m }}" + "a" * MAX_ARG_BYTES], [1]),  # the whole string counts
    (["--chat-template", "{{ m }}" + "é" * (MAX_ARG_BYTES // 2)], [1]),  # UTF-8 bytes, not characters
    # Each string on its own (the length rule alone: other rules refuse --served-model-name here).
    (["--chat-template", "{{ m }}" + "a" * 100_000, "--served-model-name", "x" * 100_000], []),
])
def test_an_engine_argument_linux_cannot_exec_is_named_by_its_index(args, refused):
    # Linux's MAX_ARG_STRLEN is per string: execve fails with E2BIG on one of 131,072 bytes or more with its NUL.
    problems = argument_length_problems(make(engineArgs=args), "m")
    assert [int(p.split("[")[1].split("]")[0]) for p in problems] == refused
    assert all(p.endswith(f"at most {MAX_ARG_BYTES} bytes each (128 KiB, MAX_ARG_STRLEN), so the engine would never "
                          "start: shorten it") for p in problems)


def test_the_probes_and_the_scrape_write_no_access_lines_by_default():
    # The kubelet's probes hit /health every few seconds and Prometheus scrapes /metrics: vLLM's filter keeps their
    # lines out of the pod's log, as vLLM manifests set it.
    container = build_deployment(make(), "x", "ns")["spec"]["template"]["spec"]["containers"][0]
    assert flag_value(container["args"], "--disable-access-log-for-endpoints") == "/health,/metrics"
    assert {container[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")} \
        == {"/health"}
    # under a --root-path, uvicorn's access line shows the path below it: both are listed
    args = engine_args(make(engineArgs=["--root-path", "/svc/"]), "x")
    assert flag_value(args, "--disable-access-log-for-endpoints") == "/health,/metrics,/svc/health,/svc/metrics"
    assert args[-2:] == ["--root-path", "/svc/"]  # engineArgs still last


@pytest.mark.parametrize("extra", [
    ["--disable-uvicorn-access-log"], ["--no-disable-uvicorn-access-log"],
    ["--disable-access-log-for-endpoints", "/ping"], ["--disable-access-log-for-endpoints=/health"],
    # vLLM's underscore spellings, which the webhook and the engine read as the dashed flags
    ["--disable_uvicorn_access_log"], ["--disable_access_log_for_endpoints", "/ping"],
])
def test_an_access_log_flag_in_engine_args_replaces_the_default(extra):
    args = engine_args(make(engineArgs=extra), "x")
    assert args.count("--disable-access-log-for-endpoints") == (extra[0] == "--disable-access-log-for-endpoints")
    assert args[-len(extra):] == extra


@pytest.mark.parametrize("extra", [["--root_path", "/svc"], ["--root_path=/svc"]])
def test_an_underscore_root_path_lists_the_paths_under_it(extra):
    # `--root_path` is the engine's --root-path (flotilla/underscore_flags.py): the probe's line reads /svc/health
    args = engine_args(make(engineArgs=extra), "x")
    assert flag_value(args, "--disable-access-log-for-endpoints") == "/health,/metrics,/svc/health,/svc/metrics"


@pytest.mark.parametrize("flag", ["--hf-overrides", "--compilation-config"])
def test_json_nested_too_deeply_in_engine_args_is_refused_not_a_crash(flag):
    # json.loads raises RecursionError past Python's recursion limit: the webhook must refuse it like other bad JSON
    problems = unsupported(make(engineArgs=[flag, "[" * 5000 + "]" * 5000]), "x")
    assert len(problems) == 1 and flag in problems[0] and "is not a valid json" in problems[0]


@pytest.mark.parametrize(("override", "refused"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, True),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, True),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, True),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, False),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, True),
])
def test_an_override_scheme_on_a_mixture_of_experts_model_is_the_engines_moe_rule(override, refused):
    """spec.quantization none and an --hf-overrides quantization_config: the engine runs the override's scheme and
    refuses every one but fp8 per row / tensor on a mixture-of-experts model (flotilla/engine_rules.py
    `moe_problem`); the webhook must see that scheme, not the absent flag."""
    spec = make(model={"source": "pvc://models/m", "config": {**ARCH, "numExperts": 8}},
                engineArgs=["--hf-overrides", json.dumps({"quantization_config": override})])
    errors = unsupported(spec, "m")
    assert any("mixture-of-experts" in e for e in errors) is refused, errors

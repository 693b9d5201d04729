"""Engine configuration: one pydantic model per component, built once and passed down.

`EngineConfig.from_kwargs` is the single place where user-facing names (the same as `vllm serve`'s
flags, with dashes turned into underscores) become validated configuration. Unknown names and flags
that are declared but not implemented yet are refused with a message that names them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import ssl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flotilla.compilation_config import compilation_problem, graph_plan, level_note
from flotilla.engine.block_hash import HashAlgo
from flotilla.engine.hf_overrides import apply_hf_overrides
from flotilla.engine.pooling.classifier_config import classifier_problem
from flotilla.engine.pooling.params import matryoshka_problem
from flotilla.engine.pooling.runner_choice import resolve_runner
from flotilla.engine.spec_decode.config import SpeculativeConfig, parse_speculative_config
from flotilla.engine.structured_output.config import StructuredOutputsConfig, parse_structured_outputs_config
from flotilla.engine_rules import (
    CHECKPOINT_DTYPES,
    RuleError,
    async_pipeline_problem,
    auto_tool_choice_problem,
    batch_budget_problem,
    default_chat_template_kwargs_problem,
    default_max_num_batched_tokens,
    draft_model_parallel_problem,
    executor_backend_problem,
    flag_name,
    gguf_load_format_problem,
    kv_scales_problem,
    log_requests_problem,
    moe_expert_widths,
    moe_problem,
    override_generation_config_problem,
    parallel_split_problem,
    pooling_problem,
    resolve_max_model_len,
    served_name_problem,
    sleep_mode_problem,
)
from flotilla.flags import FLAGS, Flag
from flotilla.quantization_config import (
    MODELOPT_FILE,
    act_order_parallel_problem,
    checkpoint_kv_cache_dtype,
    with_modelopt_file,
)
from flotilla.validation_messages import describe

logger = logging.getLogger(__name__)
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16"}
# On the CPU there is no GPU memory to profile; like vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE)
# the KV pool gets a fixed budget, capped at what max_num_seqs full-length sequences could use.
DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3


class ConfigError(ValueError):
    """A configuration value the engine cannot run with; the message names the flag."""


class _Component(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Component):
    """What to load and how: the HF directory, its architecture numbers, dtype and length limit."""

    model: str
    tokenizer: str
    served_model_name: list[str]
    dtype: Literal["bfloat16", "float16", "float32"]
    max_model_len: int = Field(gt=0)
    seed: int = 0
    enable_sleep_mode: bool = False  # --enable-sleep-mode: LLMEngine.sleep / wake_up (engine/sleep_mode.py)
    enforce_eager: bool = False  # also -O0 and --compilation-config's NONE / level 0 (flotilla/compilation_config.py)
    # --compilation-config: only its cudagraph_capture_sizes reaches the runner (None: the engine's ladders)
    compilation_config: dict[str, Any] = Field(default_factory=dict)
    optimization_level: int = 2
    max_cudagraph_capture_size: int | None = Field(None, ge=1)  # None: decode to max_num_seqs, mixed to 512
    load_format: Literal["auto", "safetensors", "dummy"] = "auto"  # safetensors: what auto reads, by vLLM's name
    # --generation-config: auto (the model's generation_config.json), vllm (none) or a folder holding one
    generation_config: str = "auto"
    # --override-generation-config: generation_config.json-named fields set over --generation-config's
    override_generation_config: dict[str, Any] = Field(default_factory=dict)
    # --logprobs-mode: which logits `logprobs` report (engine/sampler.py `reported_values`)
    logprobs_mode: Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"] = "raw_logprobs"
    # --max-logprobs: the most logprobs / prompt_logprobs a request may ask for; -1: up to the vocabulary
    max_logprobs: int = Field(20, ge=-1)
    # --runner/--convert/--task resolved (engine/pooling/runner_choice.py): pooling serves /v1/embeddings (embed)
    # or /classify and cross-encoder /score and /rerank (classify).
    runner: Literal["generate", "pooling"] = "generate"
    convert: Literal["none", "embed", "classify"] = "none"
    # The weight scheme (`engine/quantization`): --quantization, or the checkpoint's quantization_config.
    quantization: str | None = None
    hf_config: dict[str, Any]

    @property
    def logprobs_cap(self) -> int:
        """--max-logprobs as a number: -1 means the vocabulary size, as vLLM's; a larger number is the vocabulary
        size too, since a step cannot rank more tokens than there are (its top-k would fail the whole step)."""
        vocab = int(self.hf_config["vocab_size"])
        return vocab if self.max_logprobs == -1 else min(self.max_logprobs, vocab)


class CacheConfig(_Component):
    """The KV block pool."""

    block_size: int = 16
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    kv_cache_dtype: str = "auto"
    # --calculate-kv-scales: an fp8 cache's per-layer scales from a calibration forward at start-up
    # (`engine/quantization/kv_scale_calibration.py`) where the checkpoint has none.
    calculate_kv_scales: bool = False
    num_gpu_blocks_override: int | None = Field(None, gt=0)
    enable_prefix_caching: bool = True
    # --prefix-caching-hash-algo: how a full block's prefix-cache key is computed (`engine/block_hash.py`)
    prefix_caching_hash_algo: HashAlgo = "sha256"
    cpu_kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES


class SchedulerConfig(_Component):
    """Per-step limits of continuous batching."""

    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    enable_chunked_prefill: bool = False
    max_model_len: int = Field(gt=0)
    async_scheduling: bool = False
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"

    @model_validator(mode="after")
    def _budget_fits_a_prompt(self) -> SchedulerConfig:
        problem = batch_budget_problem(self.max_num_batched_tokens, self.max_model_len, self.enable_chunked_prefill)
        if problem:
            raise ValueError(problem)
        return self


class ParallelConfig(_Component):
    """Tensor and pipeline parallel sizes: `tp x pp` worker processes when above 1."""

    tensor_parallel_size: int = Field(1, gt=0)
    pipeline_parallel_size: int = Field(1, gt=0)


class LoRAConfig(_Component):
    """LoRA adapters (`--enable-lora`): the start-up adapters and the slot sizes."""

    enable_lora: bool = False
    lora_modules: tuple[tuple[str, str, str | None], ...] = ()  # (name, path, base_model_name)
    max_loras: int = Field(1, gt=0)
    max_lora_rank: int = Field(16, gt=0)
    max_cpu_loras: int = Field(1, gt=0)


class DeviceConfig(_Component):
    """Which device runs the model, and which of its kernels a step may choose."""

    device: Literal["cuda", "cpu"]
    triton_gemv_max_rows: int = Field(1, ge=0)


def _tls_files_problem(certfile: str | None, keyfile: str | None) -> str | None:
    """Why --ssl-certfile / --ssl-keyfile cannot serve HTTPS (a key without a certificate, or files Python's ssl
    cannot load as a certificate and its key), or None."""
    if certfile is None:
        return "--ssl-keyfile needs --ssl-certfile (the certificate it is the key of)" if keyfile else None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        files = f"--ssl-certfile {certfile}" + (f" and --ssl-keyfile {keyfile}" if keyfile else "")
        return f"{files} cannot be loaded as a PEM certificate and its private key ({exc.strerror or exc})"
    return None


def _client_certificates_problem(certfile: str | None, ca_certs: str | None, cert_reqs: int) -> str | None:
    """Why --ssl-ca-certs / --ssl-cert-reqs cannot check clients' certificates, or None. vLLM hands them to uvicorn
    as they are, which ignores both without --ssl-certfile and, asking for a certificate with no CA loaded,
    refuses every client: both are refused here at start-up instead."""
    if (ca_certs is not None or cert_reqs) and certfile is None:
        return ("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile (clients show certificates in the TLS "
                "handshake of HTTPS)")
    if ca_certs is None:
        return (f"--ssl-cert-reqs {cert_reqs} needs --ssl-ca-certs (the CA certificates a client's certificate is "
                "checked against; with none, every client would be refused)") if cert_reqs else None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(ca_certs)
    except (OSError, ssl.SSLError) as exc:
        return f"--ssl-ca-certs {ca_certs} cannot be loaded as PEM CA certificates ({exc.strerror or exc})"
    return None


# The shortest key a VLLM_API_KEY of several lines may hold. A value of several lines is read as several keys, so a
# Secret filled with other text (pretty-printed JSON, a PEM file) would otherwise accept guessable lines such as
# "{" or "-----BEGIN PRIVATE KEY-----"; vLLM's reading (one key that no header can match) failed closed there.
MIN_LISTED_KEY_CHARS = 8


def env_keys(value: str) -> list[str]:
    """VLLM_API_KEY's keys, one a line (a value of one line is vLLM's one key), blank lines left out; all blank, the
    value itself, which the key check refuses as empty. Lines, because no HTTP header can carry a line feed: a
    value of several lines could never match as one key (vLLM's reading), so each line is one that can. A value of
    several keys must hold only key-like lines (listed_keys_problem), or it is refused."""
    keys = [line for line in value.split("\n") if line.strip()] or [value]
    if len(keys) > 1 and (problem := listed_keys_problem(keys)):
        raise ValueError(problem)
    return keys


def listed_keys_problem(keys: list[str]) -> str | None:
    """Why VLLM_API_KEY's lines `keys` are not a list of keys (one too short, or holding a space), or None. The line
    itself is never echoed: it may be a secret."""
    for number, key in enumerate(keys, 1):
        key = key.strip()
        if len(key) < MIN_LISTED_KEY_CHARS or any(char.isspace() for char in key):
            return (f"VLLM_API_KEY holds {len(keys)} lines, read as one API key a line, and its non-blank line "
                    f"{number} is not a key (keys of a list are at least {MIN_LISTED_KEY_CHARS} characters with no "
                    "spaces): put one key a line in the Secret, not a JSON or PEM document")
    return None


class ServerConfig(_Component):
    """The HTTP front end (not part of the engine core): address, API key and the limits that keep one
    client from freezing or bloating the server."""

    host: str | None = None
    port: int = Field(8000, ge=0, le=65535)
    api_key: list[str] | None = None  # --api-key's keys (each accepted), or VLLM_API_KEY's, one a line
    shutdown_timeout: float = Field(30.0, ge=0)
    uvicorn_log_level: str = "info"
    disable_log_stats: bool = False
    enable_log_requests: bool = False  # engine/server/request_log.py
    disable_log_requests: bool = False  # vLLM's older spelling of the default (no request log lines)
    max_log_len: int | None = Field(None, ge=0)  # the request log's prompt characters / ids (None: all)
    disable_uvicorn_access_log: bool = False  # vLLM's flag: no access log line (server/access_log.py)
    response_role: str = "assistant"  # the chat reply's role after a generation prompt (serving.reply_role)
    return_tokens_as_token_ids: bool = False  # the default of requests' own return_tokens_as_token_ids
    trust_request_chat_template: bool = False
    # --chat-template as given (a path or the text: engine/server/server_chat_template.py reads it at start-up)
    chat_template: str | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None  # under each request's chat_template_kwargs
    # how message content reaches chat templates (engine/server/chat_content.py)
    chat_template_content_format: Literal["auto", "string", "openai"] = "auto"
    max_request_body_size: int = Field(8 * 1024 * 1024, gt=0)
    max_body_bytes_in_flight: int | None = Field(None, gt=0)  # None: BODY_BUDGET_BODIES x max_request_body_size
    limit_concurrency: int = Field(1024, gt=0)
    timeout_keep_alive: float = Field(5.0, gt=0)
    header_read_timeout: float = Field(10.0, gt=0)
    body_read_timeout: float = Field(30.0, gt=0)
    h11_max_incomplete_event_size: int = Field(16 * 1024, gt=0)
    h11_max_header_count: int = Field(256, gt=0)
    enable_auto_tool_choice: bool = False
    # vLLM's flag: a tool_choice "none" request's tools are left out of the prompt (by default they are rendered)
    exclude_tools_when_tool_choice_none: bool = False
    enable_request_id_headers: bool = False
    enable_prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False  # every stream's usage (serving.py `forced_usage`)
    tool_call_parser: Literal["hermes", "llama3_json", "mistral", "qwen3_coder"] | None = None
    reasoning_parser: Literal["deepseek_r1", "qwen3"] | None = None
    enable_server_load_tracking: bool = False  # GET /load counts requests in progress (vLLM's flag)
    root_path: str | None = None  # --root-path: the prefix a proxy serves the API under
    # CORS (vLLM's flags and defaults: any origin, method and header; no credentials)
    allowed_origins: list[str] = Field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = Field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = Field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    disable_fastapi_docs: bool = False  # vLLM's flag: no /openapi.json (no docs pages are served anyway)
    ssl_certfile: str | None = None  # vLLM's --ssl-certfile / --ssl-keyfile: HTTPS (uvicorn's)
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None  # vLLM's: the CAs of clients' certificates (uvicorn's ssl_ca_certs)
    ssl_cert_reqs: Literal[0, 1, 2] = 0  # ssl.VerifyMode: 0 none asked, 1 optional, 2 required (mutual TLS)
    disable_access_log_for_endpoints: str | None = None  # vLLM's: paths without access lines, comma-separated

    @model_validator(mode="after")
    def _tls_files_load(self) -> ServerConfig:
        # uvicorn loads them only once serving starts, after the model: a bad file was a traceback then.
        if problem := _tls_files_problem(self.ssl_certfile, self.ssl_keyfile) or \
                _client_certificates_problem(self.ssl_certfile, self.ssl_ca_certs, self.ssl_cert_reqs):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _a_whole_body_fits_the_budget(self) -> ServerConfig:
        # A body of the largest size allowed must be able to get in alone, or it would be refused forever.
        if self.max_body_bytes_in_flight is not None and self.max_body_bytes_in_flight < self.max_request_body_size:
            raise ValueError(f"--max-body-bytes-in-flight ({self.max_body_bytes_in_flight}) must be at least "
                             f"--max-request-body-size ({self.max_request_body_size})")
        return self

    @model_validator(mode="after")
    def _request_log_switched_one_way(self) -> ServerConfig:
        if problem := log_requests_problem(self.enable_log_requests, self.disable_log_requests):
            raise ValueError(problem)
        return self

    @field_validator("default_chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if problem := default_chat_template_kwargs_problem(value):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _auto_tools_need_a_parser(self) -> ServerConfig:
        if problem := auto_tool_choice_problem(self.enable_auto_tool_choice, self.tool_call_parser):
            raise ValueError(problem)
        return self

    @field_validator("api_key", mode="before")
    @classmethod
    def _trimmed_non_empty_keys(cls, keys: str | list[str] | None) -> list[str] | None:
        # --api-key takes one or more (vLLM's list: each is accepted, so a key can be rotated without a moment where
        # clients holding either one are refused); VLLM_API_KEY one a line (env_keys).
        # A Secret made with `kubectl create secret --from-file` ends in a newline that clients never
        # send, so each key is trimmed here exactly as the Authorization header is. An empty key (an
        # empty Secret, `--api-key ""`) must not quietly mean "no authentication": refuse it (vLLM drops
        # empty keys, and with none left serves every path open).
        if keys is None:
            return None
        if isinstance(keys, str):  # VLLM_API_KEY: its lines (a Secret may hold several keys, one a line)
            keys = env_keys(keys)
        trimmed = [key.strip() if isinstance(key, str) else key for key in keys]
        if not trimmed or any(key == "" for key in trimmed):
            raise ValueError(
                "the API key is empty (from --api-key or VLLM_API_KEY); give a non-empty key, or unset "
                "both to serve without authentication"
            )
        return trimmed

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerConfig:
        """Build from the server flags' values (`--api-key` -> `api_key`)."""
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None


class EngineConfig(_Component):
    """Every component's configuration, built once from user-facing arguments."""

    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    parallel: ParallelConfig
    device: DeviceConfig
    lora: LoRAConfig = LoRAConfig()
    speculative: SpeculativeConfig | None = None
    structured_outputs: StructuredOutputsConfig = StructuredOutputsConfig()

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> EngineConfig:
        """Build the configuration from `vllm serve`-style names (`max_model_len=...`)."""
        values = _check_flags(kwargs)
        gguf = _gguf_model(model, values)
        if gguf is not None:
            if problem := gguf_load_format_problem(values["load_format"]):
                raise ConfigError(problem)
            model_dir, hf_config = gguf
        else:
            model_dir = Path(model) if model is not None else _embedded_model_dir()
            hf_config = _read_hf_config(model_dir)
        with _as_config_error(ValueError):
            hf_config = apply_hf_overrides(hf_config, values["hf_overrides"])
        try:
            return _build(model_dir, hf_config, values, explicit_model=model is not None)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None
        except (AttributeError, TypeError, ValueError) as exc:
            # config.json's own types are trusted; an override of the wrong type (a string for a count, a null for
            # a length, a number for rope_scaling) failed deep inside the build, a traceback or a message that did
            # not name the flag.
            if isinstance(exc, ConfigError) or not values["hf_overrides"]:
                raise
            raise ConfigError(f"--hf-overrides {json.dumps(values['hf_overrides'])}: config.json with these keys "
                              f"cannot be built ({exc}); give each key the JSON type config.json gives it") from None


ENGINE_COMPONENTS = ("model", "cache", "scheduler", "parallel", "device", "lora", "speculative", "structured_outputs")
_ENGINE_FLAGS: dict[str, Flag] = {f.dest: f for f in FLAGS if f.component in ENGINE_COMPONENTS}


def _check_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Refuse unknown names and unimplemented or unsupported values; fill in the defaults."""
    unknown = sorted(set(kwargs) - set(_ENGINE_FLAGS))
    if unknown:
        names = ", ".join("--" + n.replace("_", "-") for n in unknown)
        raise ConfigError(f"unknown engine argument(s): {names}")
    values = {dest: f.default for dest, f in _ENGINE_FLAGS.items()}
    for dest, value in kwargs.items():
        problem = _ENGINE_FLAGS[dest].check_value(value)
        if problem:
            raise ConfigError(problem)
        values[dest] = value
    return values


def _gguf_model(model: str | None, values: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """A GGUF model (`engine/quantization/gguf.py`): a `.gguf` file given as the model, or none with
    `--quantization gguf` (the embedded model's own GGUF, its converted directory giving the config and the
    tokenizer). Sets `quantization` (and the embedded tokenizer) in `values`; None for any other model."""
    from flotilla.engine.quantization.gguf_file import gguf_hf_config, is_gguf_file

    if model is not None and not is_gguf_file(model):
        if values["quantization"] == "gguf":
            raise ConfigError(f"--quantization gguf serves a .gguf file as the model (with --tokenizer DIR), or the "
                              f"embedded model when none is given; {model} is not a .gguf file")
        return None
    if model is None and values["quantization"] != "gguf":
        return None
    if values["quantization"] not in (None, "gguf"):
        raise ConfigError(f"--quantization {values['quantization']}: a .gguf model serves its own quantized weights; "
                          "leave --quantization out (or give gguf)")
    values["quantization"] = "gguf"
    if model is not None:
        try:
            return Path(model), gguf_hf_config(model)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    from flotilla.engine.embedded_model import embedded_gguf_path

    converted = _embedded_model_dir()
    values["tokenizer"] = values["tokenizer"] or str(converted)
    return embedded_gguf_path(), _read_hf_config(converted)


def _embedded_model_dir() -> Path:
    from flotilla.engine.embedded_model import embedded_model_dir

    return embedded_model_dir()


def _read_hf_config(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"model {model_dir}: no config.json (expected a Hugging Face model directory)")
    modelopt = model_dir / MODELOPT_FILE  # an older ModelOpt export's quantization settings, read as vLLM does
    return with_modelopt_file(json.loads(config_path.read_text()),
                              json.loads(modelopt.read_text()) if modelopt.is_file() else None)


def classify_problem(hf_config: dict[str, Any], quantization: str | None) -> str | None:
    """Why `--convert classify` cannot build this model's head, or None (engine/pooling/classifier_config.py)."""
    if quantization == "gguf":  # a GGUF file keeps the LM head as codes, and has no score.weight
        return "--convert classify does not take a GGUF checkpoint (it has no score head to load)"
    return classifier_problem(hf_config)


def _embedded_model_name() -> str:
    from flotilla.engine.embedded_model import EMBEDDED_MODEL_NAME

    return EMBEDDED_MODEL_NAME


def _build(model_dir: Path, hf_config: dict[str, Any], v: dict[str, Any], explicit_model: bool) -> EngineConfig:
    """The engine's config from the checked flag values `v` and the model's config.json. A command line with
    several problems gets the first of a fixed order of checks, as a ConfigError."""
    with _as_config_error(RuleError):
        max_model_len = resolve_max_model_len(hf_config, v["max_model_len"])
    device = _resolve_device(v["device"])
    # torch: imported only by the engine
    from flotilla.engine.quantization import checkpoint_quantization, resolve_quantization

    with _as_config_error(ValueError):
        quantization = resolve_quantization(v["quantization"], hf_config)
    if problem := act_order_parallel_problem(hf_config.get("quantization_config"), v["tensor_parallel_size"]):
        raise ConfigError(f"model {model_dir}: {problem}")
    _check_flag_combinations(v, hf_config)
    if problem := _custom_code_problem(model_dir, hf_config, bool(v["trust_remote_code"])):
        raise ConfigError(problem)
    if problem := _architecture_problem(hf_config):
        raise ConfigError(f"model {model_dir}: {problem}")
    moe_widths = moe_expert_widths(hf_config)
    if problem := moe_problem(moe_widths, quantization, bool(v["enable_lora"]), v["tensor_parallel_size"],
                              qcfg=checkpoint_quantization(hf_config)):
        raise ConfigError(f"model {model_dir}: {problem}")
    served = _served_names(v["served_model_name"], str(model_dir) if explicit_model else _embedded_model_name())
    with _as_config_error(ValueError):
        runner, convert = resolve_runner(v["runner"], v["convert"], v["task"], hf_config)
        speculative = parse_speculative_config(v["speculative_config"])
        structured_outputs = parse_structured_outputs_config(v["structured_outputs_config"])
    if problem := pooling_problem(runner, v["enable_lora"], speculative is not None, v["tensor_parallel_size"],
                                  v["pipeline_parallel_size"]):
        raise ConfigError(problem)
    if speculative is not None and (problem := draft_model_parallel_problem(
            speculative.model_dump(), v["tensor_parallel_size"], v["pipeline_parallel_size"])):
        raise ConfigError(problem)
    if speculative is not None and speculative.model is not None and \
            (problem := draft_architecture_problem(Path(speculative.model))):
        raise ConfigError(problem)
    if problem := compilation_problem(v["compilation_config"], v["max_cudagraph_capture_size"], v["max_num_seqs"]):
        raise ConfigError(problem)
    if problem := matryoshka_problem(hf_config):
        raise ConfigError(problem)
    if convert == "classify" and (problem := classify_problem(hf_config, quantization)):
        raise ConfigError(f"model {model_dir}: {problem}")
    # A MoE model (or draft) runs eagerly: its experts' reference path reads the expert counts on the host, which a
    # CUDA graph cannot capture (`kernels.dispatch.fused_experts`)
    moe = moe_widths is not None or _draft_is_moe(speculative)
    graphs = graph_plan(v["compilation_config"], v["optimization_level"], v["enforce_eager"] or moe,
                        v["max_cudagraph_capture_size"])
    if note := level_note(v["compilation_config"], v["optimization_level"], v["enforce_eager"]):
        logger.warning(note)
    model = ModelConfig(
        model=str(model_dir),
        tokenizer=v["tokenizer"] or str(model_dir),
        served_model_name=served,
        dtype=_resolve_dtype(v["dtype"], hf_config, device, quantization, runner=runner),
        max_model_len=max_model_len,
        seed=v["seed"],
        enforce_eager=graphs.eager,
        enable_sleep_mode=bool(v["enable_sleep_mode"]),
        max_cudagraph_capture_size=graphs.max_capture_size,
        compilation_config={"cudagraph_capture_sizes": list(graphs.capture_sizes)} if graphs.capture_sizes else {},
        optimization_level=v["optimization_level"],
        load_format=v["load_format"],
        generation_config=v["generation_config"],
        override_generation_config=v["override_generation_config"] or {},
        logprobs_mode=v["logprobs_mode"],
        max_logprobs=v["max_logprobs"],
        runner=runner,
        convert=convert,
        quantization=quantization,
        hf_config=hf_config,
    )
    return EngineConfig(
        model=model,
        cache=_cache_config(v, hf_config),
        scheduler=_scheduler_config(v, max_model_len, device),
        parallel=ParallelConfig(
            tensor_parallel_size=v["tensor_parallel_size"],
            pipeline_parallel_size=v["pipeline_parallel_size"],
        ),
        device=DeviceConfig(device=device, triton_gemv_max_rows=v["triton_gemv_max_rows"]),
        lora=lora_config(v),
        speculative=speculative,
        structured_outputs=structured_outputs,
    )


@contextmanager
def _as_config_error(*errors: type[Exception]) -> Iterator[None]:
    """Raise `errors` as ConfigError with the same message: the command line prints it without a traceback."""
    try:
        yield
    except errors as e:
        raise ConfigError(str(e)) from None


def _cache_config(v: dict[str, Any], hf_config: dict[str, Any]) -> CacheConfig:
    """The KV cache's flags as one component (`auto` over a ModelOpt checkpoint with an FP8 KV cache: fp8)."""
    return CacheConfig(
        block_size=v["block_size"],
        gpu_memory_utilization=v["gpu_memory_utilization"],
        kv_cache_dtype=checkpoint_kv_cache_dtype(v["kv_cache_dtype"], hf_config.get("quantization_config")),
        calculate_kv_scales=v["calculate_kv_scales"],
        num_gpu_blocks_override=v["num_gpu_blocks_override"],
        enable_prefix_caching=v["enable_prefix_caching"],
        prefix_caching_hash_algo=v["prefix_caching_hash_algo"],
    )


def _scheduler_config(v: dict[str, Any], max_model_len: int, device: str) -> SchedulerConfig:
    """The scheduler's flags as one component, with the defaults that depend on the model and the device: the
    step's token budget, and asynchronous scheduling (on for CUDA without a pipeline)."""
    chunked = bool(v["enable_chunked_prefill"])
    budget = v["max_num_batched_tokens"]
    if budget is None:
        budget = default_max_num_batched_tokens(max_model_len, chunked)
    default_async = device == "cuda" and v["pipeline_parallel_size"] == 1
    return SchedulerConfig(
        max_num_seqs=v["max_num_seqs"],
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        max_model_len=max_model_len,
        async_scheduling=v["async_scheduling"] if v["async_scheduling"] is not None else default_async,
        scheduling_policy=v["scheduling_policy"],
    )


def _check_flag_combinations(v: dict[str, Any], hf_config: dict[str, Any]) -> None:
    """ConfigError for flags that cannot go together, or with this model: its heads, layers and MLP width
    against the parallel sizes, asynchronous scheduling with a pipeline, a generation config, KV scales."""
    pipeline = v["pipeline_parallel_size"]
    heads = hf_config["num_attention_heads"]
    problem = parallel_split_problem(
        heads, hf_config.get("num_key_value_heads") or heads, hf_config["intermediate_size"],
        hf_config["num_hidden_layers"], v["tensor_parallel_size"], pipeline,
    )
    if problem:
        raise ConfigError(f"--tensor-parallel-size/--pipeline-parallel-size: {problem}")
    if problem := async_pipeline_problem(bool(v["async_scheduling"]), pipeline):
        raise ConfigError(problem)
    if problem := sleep_mode_problem(bool(v["enable_sleep_mode"]), v["tensor_parallel_size"], pipeline):
        raise ConfigError(problem)
    if problem := executor_backend_problem(v["distributed_executor_backend"], v["tensor_parallel_size"], pipeline):
        raise ConfigError(problem)
    gen = v["generation_config"]
    if gen not in ("auto", "vllm") and not (Path(gen) / "generation_config.json").is_file():
        raise ConfigError(f"--generation-config {gen}: give auto, vllm or a folder holding generation_config.json")
    if problem := override_generation_config_problem(v["override_generation_config"]):
        raise ConfigError(problem)
    if problem := kv_scales_problem(bool(v["calculate_kv_scales"]), v["kv_cache_dtype"]):
        raise ConfigError(problem)


def _custom_code_problem(model_dir: Path, hf_config: dict[str, Any], trust_remote_code: bool) -> str | None:
    """Why a model whose config.json maps its architecture to the checkpoint's own code (auto_map) cannot be
    served: none of its architectures is built in. One that is (say a Qwen2 checkpoint that also ships code) is
    served by the built-in implementation, as vLLM prefers its own. --trust-remote-code changes neither: no
    checkpoint code runs here (the message says so when it was given)."""
    from flotilla.engine.models.registry import supported_architectures  # torch: imported only by the engine

    archs = hf_config.get("architectures") or []
    if not hf_config.get("auto_map") or set(archs) & set(supported_architectures()):
        return None
    given = "--trust-remote-code does not change this: " if trust_remote_code else ""
    return (f"model {model_dir}: config.json's auto_map asks for the checkpoint's own Python code for "
            f"{', '.join(archs) or 'its architecture'}; {given}Flotilla never runs a checkpoint's code and serves "
            f"only: {', '.join(supported_architectures())}")


def _architecture_problem(hf_config: dict[str, Any]) -> str | None:
    from flotilla.engine.models.registry import architecture_problem  # torch: imported only by the engine

    return architecture_problem(hf_config)


def _draft_is_moe(speculative: SpeculativeConfig | None) -> bool:
    """Whether the draft model's config.json (when it is there yet) is a mixture of experts."""
    if speculative is None or speculative.model is None:
        return False
    config_path = Path(speculative.model) / "config.json"
    return config_path.is_file() and moe_expert_widths(json.loads(config_path.read_text())) is not None


def draft_architecture_problem(draft_dir: Path) -> str | None:
    """Why the draft model in `draft_dir` cannot be served, in the target's words, or None; a draft directory
    without a config.json is the draft loader's to refuse (at start-up: it may be written after the config)."""
    config_path = draft_dir / "config.json"
    if not config_path.is_file():
        return None
    problem = _architecture_problem(json.loads(config_path.read_text()))
    return f"--speculative-config: draft model {draft_dir}: {problem}" if problem else None


def _served_names(given: str | list[str] | tuple[str, ...] | None, default: str) -> list[str]:
    """--served-model-name as a list (`default` when unset); ConfigError names an unusable one."""
    given = given or [default]
    served = [given] if isinstance(given, str) else list(given)
    for name in served:
        if problem := served_name_problem(name):
            raise ConfigError(problem)
    return served


def _resolve_dtype(dtype: str, hf_config: dict[str, Any], device: str = "cuda", quantization: str | None = None,
                   cpuinfo: Path = Path("/proc/cpuinfo"), runner: str = "generate") -> str:
    """`--dtype`: an explicit choice as given; `auto` is the checkpoint's dtype, except:

    - a float32 checkpoint on the GPU runs in bfloat16 (float16 for a pooling model), as vLLM's auto rule
      downcasts float32 to the platform's preferred dtype (bf16 on sm80+, which Flotilla's kernels target; vLLM
      prefers fp16 for pooling models). On the CPU it stays float32 (vLLM would take bf16 there too; the CPU
      path serves tests and development, where float32 checkpoints stay exact).
    - an unquantized bf16 model on a CPU without native bf16 instructions runs in float32 (torch's bf16 matmul
      there emulates: session 7 measured it 1.4x fp32's time at 1 row and 6.3x at 210 rows on an AVX2-only
      host). A quantized model keeps bf16: torch's packed int4/int8 CPU kernels take bf16/fp16 activations only.
    """
    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype != "auto":
        return dtype
    checkpoint = hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"
    resolved = checkpoint if checkpoint in CHECKPOINT_DTYPES else "bfloat16"
    if resolved == "float32" and device == "cuda":
        return "float16" if runner == "pooling" else "bfloat16"
    if resolved == "bfloat16" and device == "cpu" and quantization is None and cpu_native_bf16(cpuinfo) is False:
        return "float32"
    return resolved


def cpu_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU has bf16 arithmetic (x86 avx512_bf16/amx_bf16, Arm bf16); None when unknown (no
    /proc/cpuinfo: not Linux), so callers keep the checkpoint's dtype rather than guess."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(value.split()))
    return None


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    if "torch" not in sys.modules and not _torch_built_for_gpu():
        return "cpu"  # what torch.cuda.is_available() answers for such a build, without importing torch (~1 s)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_built_for_gpu() -> bool:
    """Whether the installed torch was built for CUDA or ROCm (`torch.version.cuda` / `.hip` not None), read from
    its generated `torch/version.py` (constant assignments) without importing torch; True when that cannot be told
    (torch itself answers then)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return True
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return True
    built = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name):
                built[target.id] = node.value.value
    return built.get("cuda", True) is not None or built.get("hip", True) is not None


def _format_validation_error(exc: ValidationError) -> str:
    """pydantic's errors in the user's words: `--flag-name: message`."""
    return "; ".join(describe(exc.errors(), lambda loc: flag_name(str(loc[-1])) if loc else "configuration"))


def lora_config(v: dict[str, Any]) -> LoRAConfig:
    """The LoRA flags as one component; LoRA flags without `--enable-lora` are an error (as vLLM)."""
    from flotilla.engine.lora.registry import parse_lora_module

    if not v["enable_lora"]:
        given = [f for f in ("lora_modules", "max_cpu_loras") if v[f] is not None]
        given += [f for f, default in (("max_loras", 1), ("max_lora_rank", 16)) if v[f] != default]
        if given:
            raise ConfigError(f"{', '.join(flag_name(f) for f in given)} need(s) --enable-lora")
        return LoRAConfig()
    if v["tensor_parallel_size"] != 1 or v["pipeline_parallel_size"] != 1:
        raise ConfigError("--enable-lora with --tensor-parallel-size or --pipeline-parallel-size > 1 "
                          "is not supported yet")
    try:
        modules = [parse_lora_module(m) for m in v["lora_modules"] or []]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ConfigError(f"--lora-modules: a name is given twice: {names}")
    max_cpu = v["max_cpu_loras"] if v["max_cpu_loras"] is not None else v["max_loras"]
    if max_cpu < v["max_loras"]:
        raise ConfigError(f"--max-cpu-loras ({max_cpu}) must be at least --max-loras ({v['max_loras']})")
    return LoRAConfig(
        enable_lora=True,
        lora_modules=tuple((m.name, m.path, m.base_model_name) for m in modules),
        max_loras=v["max_loras"],
        max_lora_rank=v["max_lora_rank"],
        max_cpu_loras=max_cpu,
    )

"""Engine configuration: one pydantic model per component, built once and passed down.

`EngineConfig.from_kwargs` is the single place where user-facing names (the same as `vllm serve`'s
flags, with dashes turned into underscores) become validated configuration. Unknown names and flags
that are declared but not implemented yet are refused with a message that names them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flotilla.flags import FLAGS, Flag

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
    enforce_eager: bool = False
    load_format: Literal["auto", "dummy"] = "auto"
    hf_config: dict[str, Any]

    @property
    def architecture(self) -> str:
        """The HF architecture name (first entry of config.json's `architectures`)."""
        return self.hf_config["architectures"][0]


class CacheConfig(_Component):
    """The KV block pool."""

    block_size: int = 16
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = Field(None, gt=0)
    enable_prefix_caching: bool = True
    cpu_kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES


class SchedulerConfig(_Component):
    """Per-step limits of continuous batching."""

    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    enable_chunked_prefill: bool = False
    max_model_len: int = Field(gt=0)
    async_scheduling: bool = False

    @model_validator(mode="after")
    def _budget_fits_a_prompt(self) -> SchedulerConfig:
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"--max-num-batched-tokens ({self.max_num_batched_tokens}) is smaller than --max-model-len "
                f"({self.max_model_len}): without --enable-chunked-prefill a whole prompt must fit one step. "
                "Raise --max-num-batched-tokens, lower --max-model-len, or enable chunked prefill."
            )
        return self


class ParallelConfig(_Component):
    """Tensor and pipeline parallel sizes (1 and 1 until parallelism lands)."""

    tensor_parallel_size: int = Field(1, gt=0)
    pipeline_parallel_size: int = Field(1, gt=0)


class DeviceConfig(_Component):
    """Which device runs the model."""

    device: Literal["cuda", "cpu"]


class ServerConfig(_Component):
    """The HTTP front end (not part of the engine core)."""

    host: str | None = None
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = None
    shutdown_timeout: float = Field(30, ge=0)
    uvicorn_log_level: str = "info"
    disable_log_stats: bool = False

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

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> EngineConfig:
        """Build the configuration from `vllm serve`-style names (`max_model_len=...`)."""
        values = _check_flags(kwargs)
        model_dir = Path(model) if model is not None else _embedded_model_dir()
        hf_config = _read_hf_config(model_dir)
        try:
            return _build(model_dir, hf_config, values, explicit_model=model is not None)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None


ENGINE_COMPONENTS = ("model", "cache", "scheduler", "parallel", "device")
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


def _embedded_model_dir() -> Path:
    from flotilla.engine.embedded_model import embedded_model_dir

    return embedded_model_dir()


def _read_hf_config(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"model {model_dir}: no config.json (expected a Hugging Face model directory)")
    return json.loads(config_path.read_text())


def _embedded_model_name() -> str:
    from flotilla.engine.embedded_model import EMBEDDED_MODEL_NAME

    return EMBEDDED_MODEL_NAME


def _build(model_dir: Path, hf_config: dict[str, Any], v: dict[str, Any], explicit_model: bool) -> EngineConfig:
    max_model_len = _max_model_len(hf_config, v["max_model_len"])
    chunked = bool(v["enable_chunked_prefill"])
    budget = v["max_num_batched_tokens"]
    if budget is None:
        budget = 8192 if chunked else max(max_model_len, 8192)
    device = _resolve_device(v["device"])
    async_scheduling = v["async_scheduling"] if v["async_scheduling"] is not None else device == "cuda"
    default_name = str(model_dir) if explicit_model else _embedded_model_name()
    served = v["served_model_name"] or [default_name]
    return EngineConfig(
        model=ModelConfig(
            model=str(model_dir),
            tokenizer=v["tokenizer"] or str(model_dir),
            served_model_name=list(served) if isinstance(served, list | tuple) else [served],
            dtype=_resolve_dtype(v["dtype"], hf_config),
            max_model_len=max_model_len,
            seed=v["seed"],
            enforce_eager=v["enforce_eager"],
            load_format=v["load_format"],
            hf_config=hf_config,
        ),
        cache=CacheConfig(
            block_size=v["block_size"],
            gpu_memory_utilization=v["gpu_memory_utilization"],
            kv_cache_dtype=v["kv_cache_dtype"],
            num_gpu_blocks_override=v["num_gpu_blocks_override"],
            enable_prefix_caching=v["enable_prefix_caching"],
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=v["max_num_seqs"],
            max_num_batched_tokens=budget,
            enable_chunked_prefill=chunked,
            max_model_len=max_model_len,
            async_scheduling=async_scheduling,
        ),
        parallel=ParallelConfig(
            tensor_parallel_size=v["tensor_parallel_size"],
            pipeline_parallel_size=v["pipeline_parallel_size"],
        ),
        device=DeviceConfig(device=device),
    )


def _max_model_len(hf_config: dict[str, Any], requested: int | None) -> int:
    """The model's usable length: max_position_embeddings, or the sliding window when one applies.

    Within its window, sliding-window attention equals full attention, so capping the length at the
    window keeps outputs exact without a sliding-window kernel.
    """
    limit = int(hf_config.get("max_position_embeddings", 2048))
    window = hf_config.get("sliding_window")
    if window and hf_config.get("use_sliding_window", True):
        limit = min(limit, int(window))
    if requested is None:
        return limit
    if requested > limit:
        raise ConfigError(f"--max-model-len={requested} exceeds the model's limit of {limit} tokens")
    return requested


def _resolve_dtype(dtype: str, hf_config: dict[str, Any]) -> str:
    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype != "auto":
        return dtype
    checkpoint = hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"
    return checkpoint if checkpoint in ("bfloat16", "float16", "float32") else "bfloat16"


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _format_validation_error(exc: ValidationError) -> str:
    """pydantic's errors in the user's words: `--flag-name: message`."""
    parts = []
    for err in exc.errors():
        loc = err["loc"][-1] if err["loc"] else ""
        name = "--" + str(loc).replace("_", "-") if loc else "configuration"
        parts.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)

"""The engine's configuration rules, in one stdlib-only place that the engine and the operator share.

The engine (engine/config.py) applies them when it builds its configuration; the operator's
admission (operator/admission.py) applies them to the exact command line it would give the engine,
so a spec that is admitted cannot fail at engine start-up on a rule written here. Per-flag types,
choices and ranges are declared in the flag contract (flotilla/flags.py, `Flag.check_value`); this
module adds the command-line grammar both sides accept and the rules across flags.

Messages name settings through a `name_of(dest)` function, so the engine says `--max-model-len` and
the operator says `spec.scheduling.maxModelLen`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flotilla.compilation_config import compilation_problem
from flotilla.flags import FLAGS, Flag, flag, human_readable_int, json_value
from flotilla.quantization_config import compressed_tensors_group, fp8_block_size

# Engine default of --max-num-batched-tokens with chunked prefill (and its floor without).
DEFAULT_BATCHED_TOKENS = 8192
# Model length when config.json states none (as transformers' default).
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048
# transformers' config classes whose sliding_window has a default (a config.json without the key still slides)
DEFAULT_SLIDING_WINDOW = {"MistralForCausalLM": 4096}

# The checkpoint dtypes (config.json's torch_dtype, or dtype) the engine serves as they are with --dtype auto
CHECKPOINT_DTYPES = ("bfloat16", "float16", "float32")

NameOf = Callable[[str], str]


def flag_name(dest: str) -> str:
    """The engine's own name for a setting: `max_model_len` -> `--max-model-len`."""
    return "--" + dest.replace("_", "-")


class RuleError(ValueError):
    """A configuration that breaks a rule; the message names the settings involved."""


# --- the command line ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParsedFlag:
    """One flag as given on a command line: the declaration, its value, and the token(s) it came from."""

    flag: Flag
    value: Any
    text: str


def find_flag(name: str) -> Flag | None:
    """The declared flag a command-line name means (its name, an alias, or `--no-` of a negatable one)."""
    for f in FLAGS:
        if name == f.name or name in f.aliases or (f.negatable and name == f.name.replace("--", "--no-", 1)):
            return f
    return None


def parse_value(f: Flag, text: str) -> Any:
    """A flag's value from its text, by the flag's declared type; RuleError when it is not one."""
    try:
        if f.type == "int":
            return human_readable_int(text, f.name) if f.human_readable else int(text)
        if f.type == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if f.type == "json":
            return json_value(text)
    except ValueError:
        raise RuleError(f"{f.name}: {text!r} is not a valid {f.type}") from None
    return text


def _is_value(token: str) -> bool:
    # As argparse decides: a token starting with '-' is a flag unless it reads as a negative number.
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def _attached(token: str) -> Flag | None:
    """The flag of a one-letter alias written with its value attached (`-O0`, as argparse reads it), or None."""
    if len(token) <= 2 or token[1] == "-" or "=" in token:
        return None
    f = find_flag(token[:2])
    return f if f is not None and f.type != "bool" else None


def parse_argv(argv: list[str]) -> tuple[list[ParsedFlag], list[str]]:
    """Parse engine flags (`--flag value`, `--flag=value`, bare booleans) into (flags, problems).

    Stricter than argparse on purpose: no abbreviations, no positional arguments, one value per
    flag, so whatever parses here means the same to the engine's parser.
    """
    parsed: list[ParsedFlag] = []
    problems: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        name, has_inline, inline = token.partition("=")
        f = find_flag(name) if token.startswith("-") else None
        if f is None and _attached(token) is not None:  # `-O0`: a one-letter alias with its value attached
            f, name, has_inline, inline = _attached(token), token[:2], "=", token[2:]
        if f is None:
            if not token.startswith("-"):
                problems.append(f"{token!r} is not a flag (a value must follow its flag)")
                continue
            problems.append(f"{name} is not an engine flag")
            if not has_inline and i < len(argv) and not argv[i].startswith("-"):
                i += 1  # its value: one problem, not two
            continue
        if f.type == "bool":
            if has_inline:
                either = f"{f.name} or --no-{f.name[2:]}" if f.negatable else f"{f.name} alone, or leave it out"
                problems.append(f"{f.name} takes no value (use {either})")
                continue
            parsed.append(ParsedFlag(f, not name.startswith("--no-"), token))
            continue
        if has_inline:
            text = inline
        elif i < len(argv) and _is_value(argv[i]):
            text = argv[i]
            i += 1
        else:
            problems.append(f"{f.name} needs a value")
            continue
        try:
            value = parse_value(f, text)
        except RuleError as e:
            problems.append(str(e))
            continue
        parsed.append(ParsedFlag(f, [value] if f.type == "list" else value, token))
    return parsed, problems


# --- rules across flags ----------------------------------------------------------------------------

def _rope_scaling(hf_config: dict[str, Any], max_position: int) -> tuple[str, int, str, float] | None:
    """How rope scaling lengthens the model, as vLLM derives it: (the config.json key of the length its factor
    multiplies, that length, the key of the factor, the factor); None when it does not (unscaled, or llama3 and
    longrope, whose max_position_embeddings already counts the factor)."""
    key = "rope_scaling" if hf_config.get("rope_scaling") else "rope_parameters"
    rope = hf_config.get(key) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("default", "llama3", "longrope", "su") or not rope.get("factor"):
        return None
    base: tuple[str, int] = ("max_position_embeddings", max_position)
    if rope_type == "yarn":
        # transformers settles YaRN's pretraining length so: a top-level original_max_position_embeddings first
        if hf_config.get("original_max_position_embeddings"):
            base = ("original_max_position_embeddings", int(hf_config["original_max_position_embeddings"]))
        elif rope.get("original_max_position_embeddings"):
            base = (f"{key}.original_max_position_embeddings", int(rope["original_max_position_embeddings"]))
    return (*base, f"{key}.factor", float(rope["factor"]))


def rope_scaled_length(hf_config: dict[str, Any], max_position: int) -> int:
    """The length a scaled rotary embedding reaches, as vLLM derives it: YaRN's original_max_position_embeddings
    times its factor, max_position_embeddings times the factor for linear/dynamic scaling; llama3 (whose
    max_position_embeddings already counts its factor) and unscaled models keep `max_position`."""
    scaling = _rope_scaling(hf_config, max_position)
    return max_position if scaling is None else int(scaling[1] * scaling[3])


def rope_positions(hf_config: dict[str, Any]) -> int:
    """The positions a model's rotary table covers (engine/models/llama.py builds it this long): its
    max_position_embeddings, or the rope-scaled length where that is longer."""
    max_position = int(hf_config.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS))
    return max(max_position, rope_scaled_length(hf_config, max_position))


def rope_positions_origin(hf_config: dict[str, Any], name_of: NameOf = str) -> str:
    """The config.json numbers `rope_positions` comes from, for a message ("max_position_embeddings", or e.g.
    "rope_scaling.original_max_position_embeddings 32768 x rope_scaling.factor 4"); `name_of` renames a dotted
    config.json key (the operator: its spec field)."""
    max_position = int(hf_config.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS))
    scaling = _rope_scaling(hf_config, max_position)
    if scaling is None or rope_scaled_length(hf_config, max_position) <= max_position:
        return name_of("max_position_embeddings")
    base_key, base, factor_key, factor = scaling
    return f"{name_of(base_key)} {base} x {name_of(factor_key)} {factor:g}"


def draft_length_problem(draft_positions: int, positions_from: str, max_model_len: int, max_model_len_set: bool,
                         name_of: NameOf = flag_name) -> str | None:
    """A draft model computes every position the target does, so its rotary table must cover the target's length:
    `max_model_len`, which is the target model's own length when `max_model_len_set` is false. `positions_from`
    says where `draft_positions` comes from (`rope_positions_origin`)."""
    if draft_positions >= max_model_len:
        return None
    flag_ = name_of("max_model_len")
    served = (f"{flag_} {max_model_len}" if max_model_len_set else
              f"the target model's length {max_model_len}, which is served while {flag_} is unset")
    return (f"{name_of('speculative_config')}: the draft model has positions for {draft_positions} tokens "
            f"({positions_from}), fewer than {served}; {'lower' if max_model_len_set else 'set'} {flag_} to "
            f"{draft_positions} or use a draft model with a context at least that long")


def model_len_limit(hf_config: dict[str, Any]) -> int:
    """The model's usable length: max_position_embeddings (rope-scaled, `rope_scaled_length`), or the sliding
    window when one applies.

    Within its window, sliding-window attention equals full attention, so capping the length at the
    window keeps outputs exact without a sliding-window kernel.
    """
    limit = int(hf_config.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS))
    limit = rope_scaled_length(hf_config, limit)
    archs = hf_config.get("architectures") or [""]
    window = hf_config.get("sliding_window", DEFAULT_SLIDING_WINDOW.get(archs[0]))
    if window and hf_config.get("use_sliding_window", True):
        limit = min(limit, int(window))
    return limit


def resolve_max_model_len(hf_config: dict[str, Any], requested: int | None,
                          name_of: NameOf = flag_name) -> int:
    """--max-model-len, or the model's limit when unset; RuleError when it exceeds that limit."""
    limit = model_len_limit(hf_config)
    if requested is None:
        return limit
    if requested > limit:
        raise RuleError(f"{name_of('max_model_len')}={requested} exceeds the model's limit of {limit} tokens")
    return requested


def default_max_num_batched_tokens(max_model_len: int, chunked_prefill: bool) -> int:
    """The step's token budget when unset: 8192, or max-model-len when larger and prefill is not chunked."""
    return DEFAULT_BATCHED_TOKENS if chunked_prefill else max(max_model_len, DEFAULT_BATCHED_TOKENS)


def batch_budget_problem(budget: int, max_model_len: int, chunked_prefill: bool,
                         name_of: NameOf = flag_name) -> str | None:
    """Without chunked prefill a whole prompt must fit one step's token budget."""
    if chunked_prefill or budget >= max_model_len:
        return None
    return (f"{name_of('max_num_batched_tokens')} ({budget}) is smaller than {name_of('max_model_len')} "
            f"({max_model_len}): without {name_of('enable_chunked_prefill')} a whole prompt must fit one step. "
            f"Raise {name_of('max_num_batched_tokens')}, lower {name_of('max_model_len')}, or enable chunked "
            "prefill.")


def served_name_problem(name: str, name_of: NameOf = flag_name) -> str | None:
    """A served model name must be one printable word that cannot be read as a flag."""
    if not name or name.startswith("-") or not name.isprintable() or any(c.isspace() for c in name):
        return (f"{name_of('served_model_name')} {name!r} must be a non-empty name without spaces or control "
                "characters that does not start with '-'")
    return None


def world_size(tensor_parallel_size: int, pipeline_parallel_size: int) -> int:
    """GPUs one engine replica uses: tensor x pipeline."""
    return tensor_parallel_size * pipeline_parallel_size


def parallel_split_problem(num_heads: int, num_kv_heads: int, intermediate_size: int, num_layers: int,
                           tensor: int, pipeline: int) -> str | None:
    """Why a model's layers cannot be split `tensor` x `pipeline` ways (as the engine shards them), or None.

    Query heads and the MLP split evenly over tensor ranks; KV heads split too, or, when there are
    fewer of them than ranks, each is replicated on `tensor / kv_heads` ranks; every pipeline stage
    needs at least one layer.
    """
    problems = []
    if num_heads % tensor:
        problems.append(f"{num_heads} attention heads")
    if num_kv_heads % tensor if num_kv_heads >= tensor else tensor % num_kv_heads:
        problems.append(f"{num_kv_heads} KV heads (nor replicated evenly)")
    if intermediate_size % tensor:
        problems.append(f"MLP width {intermediate_size}")
    if problems:
        return f"tensor parallel size {tensor} does not divide the model's {', '.join(problems)}"
    if num_layers < pipeline:
        return f"pipeline parallel size {pipeline} exceeds the model's {num_layers} layers"
    return None


def moe_num_experts(hf_config: Mapping[str, Any]) -> Any:
    """A mixture-of-experts config.json's expert count as written — `num_local_experts` (Mixtral; transformers 5 writes
    Qwen3-MoE's so too) or `num_experts` (Qwen) — or None (also 0) for a dense model."""
    return hf_config.get("num_local_experts") or hf_config.get("num_experts")


def moe_expert_widths(hf_config: Mapping[str, Any]) -> list[int] | None:
    """A mixture-of-experts config.json's expert widths that tensor parallelism splits (the experts', and Qwen2-MoE's
    shared expert's), or None for a dense model. Experts are counted by `num_local_experts` (Mixtral; transformers 5
    writes Qwen3-MoE's so too) or `num_experts` (Qwen); their width is `moe_intermediate_size` (Qwen) or
    `intermediate_size` (Mixtral)."""
    if not moe_num_experts(hf_config):
        return None
    width = hf_config.get("moe_intermediate_size") or hf_config.get("intermediate_size") or 0
    shared = hf_config.get("shared_expert_intermediate_size") or 0
    return [int(width)] + ([int(shared)] if shared else [])


def moe_dense_layers(num_layers: int, decoder_sparse_step: int | None, mlp_only_layers: list[int] | None) -> set[int]:
    """The layers of a mixture-of-experts model that keep a dense MLP, as transformers' Qwen-MoE decoder picks them:
    those in `mlp_only_layers`, and those where `(layer + 1) % decoder_sparse_step` is not 0 (Mixtral has neither
    key: every layer is sparse)."""
    step, only = decoder_sparse_step or 1, set(mlp_only_layers or [])
    return {i for i in range(num_layers) if i in only or (i + 1) % step}


def moe_quantization_runs(quantization: str | None, qcfg: Any) -> bool:
    """Whether a mixture-of-experts model's experts run `quantization` (resolved: the flag or the checkpoint's
    `quant_method`) over the checkpoint's `quantization_config` `qcfg` (None: a dense checkpoint): none, or fp8 with
    one scale per row or per tensor — quantized at load (`--quantization fp8`), vLLM's fp8 checkpoints, or
    compressed-tensors' float weights (engine/layers/moe.py). Block-scaled fp8 (weight_block_size) is not. Without
    `qcfg` fp8 and compressed-tensors pass: the engine always has the checkpoint's (a compressed-tensors one needs
    it), the operator's webhook only an --hf-overrides one, and leaves the rest to the engine's start-up check."""
    if quantization is None:
        return True
    if quantization not in ("fp8", "compressed-tensors"):
        return False
    if qcfg is None:  # fp8 at load; or the webhook, which sees no checkpoint: the engine decides at start-up
        return True
    if _fp8_blocks(qcfg):
        return False
    try:
        return quantization == "fp8" or compressed_tensors_group(qcfg).get("weights", {}).get("type") == "float"
    except (ValueError, AttributeError):  # a malformed config: its own check names the problem
        return False


def _fp8_blocks(qcfg: Any) -> bool:
    """Whether a quantization_config describes block-scaled fp8 (False also for one that names its blocks wrongly:
    its own check says so)."""
    try:
        return fp8_block_size(qcfg) is not None
    except ValueError:
        return False


def moe_problem(expert_widths: list[int] | None, quantization: str | None, enable_lora: bool, tensor: int,
                name_of: NameOf = flag_name, qcfg: Any = None) -> str | None:
    """Why a mixture-of-experts model (`moe_expert_widths`) cannot serve with these settings, or None: its experts
    run unquantized or fp8 (`moe_quantization_runs`; another scheme would quantize only the attention, so the result
    would differ from what was asked without a word) and without adapters, and tensor parallelism splits every
    expert's width evenly. `qcfg`: the checkpoint's quantization_config (or the operator's override), if any."""
    if expert_widths is None:
        return None
    if not moe_quantization_runs(quantization, qcfg):
        kind = "block-scaled fp8 (weight_block_size)" if _fp8_blocks(qcfg) else quantization
        return (f"{name_of('quantization')} {quantization} (given, or the checkpoint's quantization_config) is "
                f"not supported for mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) as {kind}: their "
                "experts run unquantized or fp8 with a scale per row or per tensor (--quantization fp8 on an "
                "unquantized checkpoint, or an fp8 checkpoint)")
    if enable_lora:
        return (f"{name_of('enable_lora')} is not supported for mixture-of-experts models (Mixtral, Qwen2-MoE, "
                "Qwen3-MoE): adapters would reach the attention only, not the experts; remove it")
    uneven = [width for width in expert_widths if width % tensor]
    if uneven:
        return (f"{name_of('tensor_parallel_size')} {tensor} does not divide the model's expert width "
                f"{uneven[0]}")
    return None


def pooling_problem(runner: str, enable_lora: bool, speculative: bool, tensor: int, pipeline: int,
                    name_of: NameOf = flag_name) -> str | None:
    """Why the pooling runner cannot serve with these settings, or None. Its pass (engine/pooling/embed.py)
    runs on the engine's own model in one process and applies neither adapters nor speculation, so each of
    them would be silently unused (and tensor/pipeline parallelism would refuse every request)."""
    if runner != "pooling":
        return None
    fixes = [f"remove {name_of(dest)}" for dest, given in (("enable_lora", enable_lora),
                                                            ("speculative_config", speculative)) if given]
    fixes += [f"set {name_of(dest)} to 1" for dest, size in (("tensor_parallel_size", tensor),
                                                            ("pipeline_parallel_size", pipeline)) if size > 1]
    if not fixes:
        return None
    return (f"{name_of('runner')} pooling serves embeddings on one GPU, without LoRA adapters or speculative "
            f"decoding: {', '.join(fixes)}")


def draft_model_parallel_problem(speculative_config: Any, tensor: int, pipeline: int,
                                 name_of: NameOf = flag_name) -> str | None:
    """A draft model runs beside the target's runner in one process (engine/spec_decode/speculator.py), not beside
    tensor- or pipeline-parallel workers: refused before anything loads. `speculative_config` is the flag's value
    as a dict (a draft model given without a method means the draft-model method, as vLLM's)."""
    if not isinstance(speculative_config, dict) or tensor * pipeline == 1:
        return None
    method = speculative_config.get("method") or ("draft_model" if speculative_config.get("model") else None)
    if method != "draft_model":
        return None
    return (f"{name_of('speculative_config')} with a draft model runs on one GPU, not beside tensor or pipeline "
            f"parallelism yet: use the ngram method, or set {name_of('tensor_parallel_size')} and "
            f"{name_of('pipeline_parallel_size')} to 1")


def async_pipeline_problem(async_scheduling: bool, pipeline: int, name_of: NameOf = flag_name) -> str | None:
    """Why asynchronous scheduling cannot run with these settings, or None: an earlier pipeline stage
    never holds the tokens the last stage drew, so the next step could not read them."""
    if async_scheduling and pipeline > 1:
        return f"{name_of('async_scheduling')} does not work with {name_of('pipeline_parallel_size')} > 1 yet"
    return None


def sleep_mode_problem(enable_sleep_mode: bool, tensor: int, pipeline: int, name_of: NameOf = flag_name) -> str | None:
    """Why sleep mode cannot run with these settings, or None: the engine moves and frees the model's memory in its
    own process, so the model must run there (one tensor and one pipeline rank), not in spawned workers."""
    if enable_sleep_mode and tensor * pipeline > 1:
        return (f"{name_of('enable_sleep_mode')} works with {name_of('tensor_parallel_size')} 1 and "
                f"{name_of('pipeline_parallel_size')} 1 only (the workers of more ranks cannot sleep yet)")
    return None


def executor_backend_problem(backend: str | None, tensor: int, pipeline: int,
                             name_of: NameOf = flag_name) -> str | None:
    """Why --distributed-executor-backend cannot run these ranks, or None: uni is the model in the engine core's own
    process, a single rank (vLLM's UniProcExecutor), so more than one tensor or pipeline rank needs mp."""
    if backend != "uni" or tensor * pipeline == 1:
        return None
    return (f"{name_of('distributed_executor_backend')} uni runs the model in the engine's own process, one rank; "
            f"{name_of('tensor_parallel_size')} {tensor} x {name_of('pipeline_parallel_size')} {pipeline} ranks run "
            "as worker processes: use mp (or leave it out)")


def kv_scales_problem(calculate_kv_scales: bool, kv_cache_dtype: str, name_of: NameOf = flag_name) -> str | None:
    """Why --calculate-kv-scales cannot be used with this cache, or None: the scales exist only to
    store K and V in an fp8 cache. (vLLM accepted the flag on any cache and ignored it there; a flag
    that silently does nothing is refused here instead.)"""
    if calculate_kv_scales and not kv_cache_dtype.startswith("fp8"):
        return (f"{name_of('calculate_kv_scales')} computes the scales of an fp8 KV cache: set "
                f"{name_of('kv_cache_dtype')} fp8 with it, or leave it out")
    return None


def rtn_settings(env: Mapping[str, str]) -> tuple[int, int | None]:
    """`--quantization rtn`'s (bits, group size or None for one group a row) from RTN_NUM_BITS (4 or 8, default 8)
    and RTN_GROUP_SIZE (inputs per scale, default 128; -1: one group a row), as vLLM reads them from the
    environment; RuleError when they name something else. The engine reads its own environment; the operator
    the literal values of spec.pod.env."""
    bits, group = env.get("RTN_NUM_BITS", "8"), env.get("RTN_GROUP_SIZE", "128")
    if bits not in ("4", "8"):
        raise RuleError(f"RTN_NUM_BITS={bits}: --quantization rtn quantizes to 4 or 8 bits")
    if not group.lstrip("-").isdigit() or (int(group) <= 0 and int(group) != -1):
        raise RuleError(f"RTN_GROUP_SIZE={group}: a positive number of inputs, or -1 for one group a row")
    return int(bits), None if int(group) == -1 else int(group)


def auto_tool_choice_problem(enabled: bool, parser: str | None, name_of: NameOf = flag_name) -> str | None:
    """Automatic tool choice parses the model's tool calls, so it needs the model family's parser."""
    if enabled and parser is None:
        return (f"{name_of('enable_auto_tool_choice')} needs {name_of('tool_call_parser')} (hermes, llama3_json, "
                "mistral or qwen3_coder)")
    return None


def log_requests_problem(enable: bool, disable: bool, name_of: NameOf = flag_name) -> str | None:
    """--disable-log-requests is vLLM's older spelling of the default: given with --enable-log-requests, the
    command says both things."""
    if enable and disable:
        return (f"{name_of('enable_log_requests')} and {name_of('disable_log_requests')} contradict each other: "
                "give one")
    return None


def gguf_load_format_problem(load_format: str, name_of: NameOf = flag_name) -> str | None:
    """A .gguf model is read from its own file: --load-format safetensors (an HF directory's .safetensors files)
    cannot load it."""
    if load_format == "safetensors":
        return (f"{name_of('load_format')} safetensors reads an HF directory's .safetensors files; a .gguf model is "
                f"read from its own file (leave {name_of('load_format')} out)")
    return None


def _positive_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# --structured-outputs-config's keys as the engine's StructuredOutputsConfig declares them (engine/structured_output/
# config.py, pydantic, which the operator may not import), each with what it takes (no more than the engine takes);
# tests/test_engine_rules.py keeps the keys in step, and tests/operator/test_admission_property.py runs what this
# admits through the engine's own parser.
STRUCTURED_OUTPUTS_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "backend": ('"auto" or "xgrammar"', lambda v: isinstance(v, str) and v in ("auto", "xgrammar")),
    "disable_any_whitespace": ("true or false", lambda v: isinstance(v, bool)),
    "compile_timeout_s": ("a number of seconds above 0", _positive_seconds),
    "warm_up": ("true or false", lambda v: isinstance(v, bool)),
    "reasoning_parser": ('"deepseek_r1", "qwen3" or null', lambda v: v is None or v in ("deepseek_r1", "qwen3")),
    "enable_in_reasoning": ("true or false", lambda v: isinstance(v, bool)),
}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# --override-generation-config's keys that set requests' defaults (vLLM's list; generation_config.json names, so
# max_new_tokens is the default max_tokens), each with the values SamplingParams takes. vLLM ignores other keys.
GENERATION_OVERRIDE_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "repetition_penalty": ("a number above 0", lambda v: _number(v) and v > 0),
    "temperature": ("a number from 0 to 2", lambda v: _number(v) and 0 <= v <= 2),
    "top_k": ("an integer >= -1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= -1),
    "top_p": ("a number above 0 and at most 1", lambda v: _number(v) and 0 < v <= 1),
    "min_p": ("a number from 0 to 1", lambda v: _number(v) and 0 <= v <= 1),
    "max_new_tokens": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
}


def override_generation_config_problem(value: Any, name_of: NameOf = flag_name) -> str | None:
    """Why the engine would refuse `value` (the flag's parsed JSON) as --override-generation-config, or None.
    A sampling key with a value no request could use is refused here rather than failing every request."""
    if value is None:
        return None
    flag = name_of("override_generation_config")
    if not isinstance(value, dict):
        return f"{flag} must be a JSON object"
    for key, item in value.items():
        if key in GENERATION_OVERRIDE_KEYS and item is not None:
            what, takes = GENERATION_OVERRIDE_KEYS[key]
            if not takes(item):
                return f"{flag}: {key} must be {what}, not {json.dumps(item)}"
    return None


def structured_outputs_problem(value: Any, name_of: NameOf = flag_name) -> str | None:
    """Why the engine would refuse `value` (the flag's parsed JSON) as --structured-outputs-config, or None."""
    if value is None:
        return None
    flag = name_of("structured_outputs_config")
    if not isinstance(value, dict):
        return f"{flag} must be a JSON object"
    for key, item in value.items():
        if key not in STRUCTURED_OUTPUTS_KEYS:
            return f"{flag}: {key}: not a key it takes ({', '.join(STRUCTURED_OUTPUTS_KEYS)})"
        what, takes = STRUCTURED_OUTPUTS_KEYS[key]
        if not takes(item):
            return f"{flag}: {key} must be {what}, not {json.dumps(item)}"
    return None


# What a --chat-template value holds when it is a template rather than a file path (vLLM's rule).
CHAT_TEMPLATE_MARKS = "{}\n"
# Names that transformers' `apply_chat_template` takes as its own arguments, not template variables: a request's
# chat_template_kwargs and --default-chat-template-kwargs may not set them (tokenize=True would change what it
# returns, chat_template the program).
CHAT_TEMPLATE_RENDERER_ARGUMENTS = frozenset({
    "chat_template", "conversation", "messages", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})


def looks_like_chat_template(value: str) -> bool:
    """True when a --chat-template value is a template's text: it holds a `{`, a `}` or a newline (vLLM's marks)."""
    return any(mark in value for mark in CHAT_TEMPLATE_MARKS)


def default_chat_template_kwargs_problem(value: Any, name_of: NameOf = flag_name) -> str | None:
    """Why the engine would refuse `value` (the flag's parsed JSON) as --default-chat-template-kwargs, or None."""
    if value is None:
        return None
    flag = name_of("default_chat_template_kwargs")
    if not isinstance(value, dict):
        return f"{flag} must be a JSON object"
    if reserved := sorted(CHAT_TEMPLATE_RENDERER_ARGUMENTS & value.keys()):
        return f"{flag} may not set {', '.join(reserved)}: the renderer's own arguments, not template variables"
    return None


def cross_flag_problems(values: dict[str, Any], hf_config: dict[str, Any] | None,
                        name_of: NameOf = flag_name) -> list[str]:
    """Every rule across flags that `values` (dest -> value, unset ones absent or None) break.

    `hf_config` is the model's config.json when known. Without it the model's length limit is
    unknown, so a token budget set without chunked prefill cannot be checked against the length the
    engine would pick: that is refused too, asking for the length to be set.
    """
    problems = []
    pooling = pooling_problem(values.get("runner") or "auto", bool(values.get("enable_lora")),
                              values.get("speculative_config") is not None, values.get("tensor_parallel_size") or 1,
                              values.get("pipeline_parallel_size") or 1, name_of)
    if pooling:
        problems.append(pooling)
    draft = draft_model_parallel_problem(values.get("speculative_config"), values.get("tensor_parallel_size") or 1,
                                         values.get("pipeline_parallel_size") or 1, name_of)
    if draft:
        problems.append(draft)
    executor = executor_backend_problem(values.get("distributed_executor_backend"),
                                        values.get("tensor_parallel_size") or 1,
                                        values.get("pipeline_parallel_size") or 1, name_of)
    if executor:
        problems.append(executor)
    sleep = sleep_mode_problem(bool(values.get("enable_sleep_mode")), values.get("tensor_parallel_size") or 1,
                               values.get("pipeline_parallel_size") or 1, name_of)
    if sleep:
        problems.append(sleep)
    asynchronous = async_pipeline_problem(bool(values.get("async_scheduling")),
                                          values.get("pipeline_parallel_size") or 1, name_of)
    if asynchronous:
        problems.append(asynchronous)
    kv_scales = kv_scales_problem(bool(values.get("calculate_kv_scales")), values.get("kv_cache_dtype") or "auto",
                                  name_of)
    if kv_scales:
        problems.append(kv_scales)
    tools = auto_tool_choice_problem(bool(values.get("enable_auto_tool_choice")), values.get("tool_call_parser"),
                                     name_of)
    if tools:
        problems.append(tools)
    log_requests = log_requests_problem(bool(values.get("enable_log_requests")),
                                        bool(values.get("disable_log_requests")), name_of)
    if log_requests:
        problems.append(log_requests)
    structured = structured_outputs_problem(values.get("structured_outputs_config"), name_of)
    if structured:
        problems.append(structured)
    overrides = override_generation_config_problem(values.get("override_generation_config"), name_of)
    if overrides:
        problems.append(overrides)
    compilation = compilation_problem(values.get("compilation_config"), values.get("max_cudagraph_capture_size"),
                                      values.get("max_num_seqs") or flag("--max-num-seqs").default)
    if compilation:
        problems.append(compilation)
    template_kwargs = default_chat_template_kwargs_problem(values.get("default_chat_template_kwargs"), name_of)
    if template_kwargs:
        problems.append(template_kwargs)
    for name in values.get("served_model_name") or []:
        problem = served_name_problem(name, name_of)
        if problem:
            problems.append(problem)
    requested = values.get("max_model_len")
    chunked = bool(values.get("enable_chunked_prefill"))
    budget = values.get("max_num_batched_tokens")
    if hf_config is not None:
        try:
            max_model_len: int | None = resolve_max_model_len(hf_config, requested, name_of)
        except RuleError as e:
            return [*problems, str(e)]
    else:
        max_model_len = requested
    if budget is not None and not chunked:
        if max_model_len is None:
            problems.append(f"{name_of('max_num_batched_tokens')} is set without "
                            f"{name_of('enable_chunked_prefill')}, so it must hold the longest prompt: set "
                            f"{name_of('max_model_len')} so that can be checked, or enable chunked prefill")
        else:
            problem = batch_budget_problem(budget, max_model_len, chunked, name_of)
            if problem:
                problems.append(problem)
    return problems

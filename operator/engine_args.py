"""InferenceService spec -> the engine's command line, from the flag contract (flotilla/flags.py).

The engine's command line is the whole contract between the operator and the engine. Every spec
field that sets a flag is listed in `FIELD_VALUES` under the flag's `crd_field`; a test checks that
this table and flags.py name the same fields, so a flag can't gain a CRD field without the operator
knowing how to render it.

spec.engineArgs carries the flags that have no field. They are parsed by the grammar the engine's
parser accepts (flotilla/engine_rules.py), refused when the operator owns them (OPERATOR_OWNED, with
the reason) or has not classified them (ENGINE_ARGS_ALLOWED is an allow-list), and their values are
checked by the contract's types and ranges. `unsupported` then applies the engine's own cross-flag
rules to everything the spec renders.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, get_args

from pydantic.alias_generators import to_camel

from flotilla.dotted_args import expand_dotted_args, flag_options
from flotilla.engine_rules import (
    ParsedFlag,
    cross_flag_problems,
    draft_length_problem,
    flag_name,
    gguf_load_format_problem,
    looks_like_chat_template,
    moe_problem,
    parse_argv,
    rope_positions_origin,
)
from flotilla.flags import FLAGS, MODEL_FLAG, Flag, flag, flag_for_crd_field
from flotilla.hf_override_values import override_values_problem
from flotilla.operator.lora_volumes import lora_modules
from flotilla.operator.model_volume import model_path
from flotilla.operator.names import TOKENIZER_PATH
from flotilla.operator.spec import InferenceServiceSpec
from flotilla.quantization_config import (
    act_order_parallel_problem,
    fp8_block_decoder_problem,
    fp8_block_size,
    override_method_problem,
)
from flotilla.removed_flags import removed_flag_problem
from flotilla.underscore_flags import dashed_names

ENGINE_COMMAND = ["flotilla", "serve"]


def _speculative_config(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    s = spec.speculative
    if s is None:
        return None
    config: dict[str, Any] = {"method": s.method, "num_speculative_tokens": s.num_tokens}
    if s.draft_model:
        config["model"] = s.draft_model
    return config


# crd_field (dotted path under spec) -> the flag's value for a spec and the InferenceService's name.
# None means "not set": the flag is left out and the engine's default applies.
FIELD_VALUES: dict[str, Callable[[InferenceServiceSpec, str], Any]] = {
    "model.servedName": lambda s, name: [s.served_name(name)],
    "model.tokenizer": lambda s, _: TOKENIZER_PATH if s.model.tokenizer else None,
    "dtype": lambda s, _: s.dtype,
    "quantization": lambda s, _: None if s.effective_quantization == "none" else s.effective_quantization,
    "runner": lambda s, _: s.runner,
    "kvCache.dtype": lambda s, _: s.kv_cache.dtype,
    "kvCache.blockSize": lambda s, _: s.kv_cache.block_size,
    "kvCache.gpuMemoryUtilization": lambda s, _: s.kv_cache.gpu_memory_utilization,
    "kvCache.prefixCaching": lambda s, _: s.kv_cache.prefix_caching,
    "kvCache.calculateScales": lambda s, _: s.kv_cache.calculate_scales,
    "scheduling.maxModelLen": lambda s, _: s.scheduling.max_model_len,
    "scheduling.maxNumSeqs": lambda s, _: s.scheduling.max_num_seqs,
    "scheduling.maxNumBatchedTokens": lambda s, _: s.scheduling.max_num_batched_tokens,
    "scheduling.chunkedPrefill": lambda s, _: s.scheduling.chunked_prefill,
    "parallelism.tensor": lambda s, _: s.parallelism.tensor,
    "parallelism.pipeline": lambda s, _: s.parallelism.pipeline,
    "speculative": lambda s, _: _speculative_config(s),
    "lora": lambda s, _: s.lora is not None,
    "lora.adapters": lambda s, _: lora_modules(s),
    # Without spec.lora these are the engine's defaults, which it accepts without --enable-lora.
    "lora.maxLoras": lambda s, _: s.lora.max_loras if s.lora is not None else 1,
    "lora.maxLoraRank": lambda s, _: s.lora.max_lora_rank if s.lora is not None else 16,
    "lora.maxCpuLoras": lambda s, _: s.lora.max_cpu_loras if s.lora is not None else None,
    # Rendered as the flag's environment variable from the Secret (deployment.py), never as argv,
    # so the key stays out of the pod spec; the value here only feeds the "implemented?" check.
    "apiKeySecretRef": lambda s, _: s.api_key_secret_ref,
}


def _render(flag: Flag, value: Any) -> list[str]:
    if flag.type == "bool":
        if value:
            return [flag.name]
        return [flag.name.replace("--", "--no-", 1)] if flag.negatable else []
    if flag.type == "json":
        return [flag.name, json.dumps(value, separators=(",", ":"), sort_keys=True)]
    if flag.type == "list":
        return [flag.name, *[str(v) for v in value]]
    return [flag.name, str(value)]


def _is_sent(flag: Flag, value: Any) -> bool:
    # Implemented flags are always sent, so the pod spec shows every setting in force. A flag the
    # engine does not implement yet is sent only when it departs from its default: the webhook has
    # refused such a spec already, and the engine would refuse it too.
    if value is None or flag.env:
        return False
    return flag.implemented or value != flag.default


def engine_args(spec: InferenceServiceSpec, name: str) -> list[str]:
    """The engine's arguments after `flotilla serve`: MODEL (/model, or the GGUF file in it), then one flag per set
    field, then engineArgs."""
    args = [model_path(spec)]
    for crd_field, value_of in FIELD_VALUES.items():
        flag = flag_for_crd_field(crd_field)
        assert flag is not None, crd_field  # the contract test keeps FIELD_VALUES and flags.py in step
        value = value_of(spec, name)
        if _is_sent(flag, value):
            args += _render(flag, value)
    return args + quiet_probe_args(spec.engine_args) + list(spec.engine_args)


# What the kubelet's probes (/health, every 5 to 10 s per pod) and Prometheus' scrape (/metrics) request: their
# access-log lines, one each time, would bury the API's requests in the pod's log.
QUIET_PATHS = ("/health", "/metrics")
# engineArgs that say what the access log keeps: then the operator adds nothing.
ACCESS_LOG_FLAGS = frozenset({"--disable-uvicorn-access-log", "--no-disable-uvicorn-access-log",
                              "--disable-access-log-for-endpoints"})
ROOT_PATH_FLAG = "--root-path"


def quiet_probe_args(extra: list[str]) -> list[str]:
    """`--disable-access-log-for-endpoints` with the probes' and the scrape's paths (QUIET_PATHS), unless engineArgs
    set an access-log flag of their own. uvicorn's access line shows a path under --root-path (`/svc/health` for the
    probe's `/health`), so with one the paths under it are listed too. Names are read as the engine reads them
    (`--root_path` is --root-path: flotilla/underscore_flags.py)."""
    extra = dashed_names(extra)
    if any(token.split("=", 1)[0] in ACCESS_LOG_FLAGS for token in extra):
        return []
    root = _root_path(extra).rstrip("/")
    paths = [*QUIET_PATHS, *(root + path for path in QUIET_PATHS if root)]
    return ["--disable-access-log-for-endpoints", ",".join(paths)]


def _root_path(extra: list[str]) -> str:
    """engineArgs' --root-path (the last one given, as a parser reads it), or "" when none is."""
    root = ""
    for i, token in enumerate(extra):
        if token == ROOT_PATH_FLAG and i + 1 < len(extra):
            root = extra[i + 1]
        elif token.startswith(ROOT_PATH_FLAG + "="):
            root = token.removeprefix(ROOT_PATH_FLAG + "=")
    return root


# Flags that the operator sets itself, or that would undo what it guarantees: refused in
# spec.engineArgs, with the reason shown to the user.
OPERATOR_OWNED: dict[str, str] = {
    "--ssl-certfile": "the probes, the Service and the ServiceMonitor speak plain HTTP to the engine; terminate TLS "
                      "at the gateway or a service mesh (docs/server.md)",
    "--ssl-keyfile": "the probes, the Service and the ServiceMonitor speak plain HTTP to the engine; terminate TLS "
                     "at the gateway or a service mesh (docs/server.md)",
    "--ssl-ca-certs": "the probes, the Service and the ServiceMonitor speak plain HTTP to the engine, and show no "
                      "client certificate; verify clients at the gateway or a service mesh (docs/server.md)",
    "--ssl-cert-reqs": "the probes, the Service and the ServiceMonitor speak plain HTTP to the engine, and show no "
                       "client certificate; verify clients at the gateway or a service mesh (docs/server.md)",
    "--port": "the probes, the Service and the ServiceMonitor reach the engine on port 8000",
    "--host": "the probes and the Service reach the engine on every pod address",
    "--device": "engine pods run on the GPUs they request",
    "--num-gpu-blocks-override": "the KV cache is sized by spec.kvCache.gpuMemoryUtilization, which the fit "
                                 "check reads",
    # spec.runner chooses the runner; the engine's --convert auto then follows the architecture (classify for
    # *ForSequenceClassification, else embed), as vLLM's.
    "--convert": "spec.runner sets the runner, and pooling converts as the architecture implies (classify for "
                 "*ForSequenceClassification, else embed)",
    "--task": "spec.runner sets the runner (--task is vLLM's older spelling of --runner/--convert)",
    # vLLM's Hub download flags: the operator fetches spec.model.source (hf://org/name: the repository's default
    # branch; hf://org/name:revision pins one) into the pod, and the engine reads local directories only.
    "--revision": "it downloads spec.model.source into the pod (the engine reads local directories only); pin the "
                  "revision there: hf://org/name:revision",
    "--tokenizer-revision": "it downloads spec.model.source (and spec.model.tokenizer) into the pod (the engine reads "
                            "local directories only); pin the revision there: hf://org/name:revision",
    "--download-dir": "it downloads spec.model.source into the pod's model volume; the engine reads local "
                      "directories only",
    # Sleep mode is driven through vLLM's development routes (VLLM_SERVER_DEV_MODE), which spec.pod.env may not turn
    # on (engine_env.py): in an InferenceService the flag would only refuse tensor parallelism.
    "--enable-sleep-mode": "an InferenceService never serves the development routes (/sleep, /wake_up) that drive "
                           "it; sleep mode is for an engine an RL trainer runs itself (docs/server.md)",
}
# Flags spec.engineArgs may carry with these values only (the others are the operator's, for the reason given).
OPERATOR_OWNED_VALUES: dict[str, tuple[tuple[str, ...], str]] = {
    # auto and safetensors (vLLM's name for what auto reads, which vLLM manifests carry) load spec.model.source's
    # weights; dummy would not.
    "--load-format": (("auto", "safetensors"), "the weights come from spec.model.source (dummy would serve random "
                                               "weights)"),
}
# Flags spec.engineArgs may carry: settings with no field of their own that change neither where
# the engine listens nor what it loads. A flag in neither table (e.g. one added to the contract
# after this operator version) is refused until it is classified here.
ENGINE_ARGS_ALLOWED = frozenset({
    "--seed", "--enforce-eager", "--async-scheduling", "--disable-log-stats", "--shutdown-timeout",
    # Requests' default sampling fields (the model's generation_config.json, vLLM's neutral ones, or a folder's
    # file in the pod, with the override's over them): what a request leaves out, not what is loaded.
    "--generation-config", "--override-generation-config",
    # Which logits a request's logprobs report (vLLM's flag): what is returned, not what is drawn or loaded.
    "--logprobs-mode",
    "--uvicorn-log-level", "--triton-gemv-max-rows", "--max-cudagraph-capture-size",
    # vLLM's compilation settings, as far as they set the CUDA graphs (-O0: none; sizes), as --enforce-eager and
    # --max-cudagraph-capture-size do; a key with no meaning here is refused (flotilla/compilation_config.py).
    "--compilation-config", "--optimization-level",
    # Request order only (fcfs or priority); requests still need `priority` to differ.
    "--scheduling-policy",
    # The server's request limits and timeouts: they bound what clients may send, within the
    # contract's ranges, and act on this InferenceService's pods alone.
    "--max-request-body-size", "--limit-concurrency", "--timeout-keep-alive", "--header-read-timeout",
    "--body-read-timeout", "--h11-max-incomplete-event-size", "--h11-max-header-count", "--max-body-bytes-in-flight",
    # Lets this service's own clients send chat templates, still rendered in the bounded sandbox
    # (docs/server.md): the owner's choice for their endpoint, no access beyond the pod.
    "--trust-request-chat-template",
    # The form message content takes in the chat template (vLLM's flag): how this model's template reads it.
    "--chat-template-content-format",
    # The owner's chat template and its default variables for this model: only the template's text, never a path
    # (`_pod_file_problem`), so the pod reads no file into prompts.
    "--chat-template", "--default-chat-template-kwargs",
    # How this model family writes tool calls and thinking (docs/structured-output.md): a property of
    # the model the owner serves, parsed in the pod's own server.
    "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--exclude-tools-when-tool-choice-none",
    # What responses report (an X-Request-Id header, cached prompt tokens in usage, usage on every stream): no
    # effect on serving.
    "--enable-request-id-headers", "--enable-prompt-tokens-details", "--enable-force-include-usage",
    # Compact JSON for this service's grammars (a small model that loops on whitespace): per pod.
    "--structured-outputs-config",
    # Which browser origins may call this service (CORS; the API key still applies): the owner's choice.
    "--allowed-origins", "--allowed-methods", "--allowed-headers", "--allow-credentials",
    # The prefix a proxy in front of this service strips: the pod still answers the probes' /health and the
    # scrape's /metrics at the root (uvicorn's root_path), so nothing the operator relies on moves.
    "--root-path",
    # GET /load reports the requests in progress (vLLM's flag): what a probe may read, nothing served changes.
    "--enable-server-load-tracking",
    # How prefix-cache keys are computed (vLLM's flag; sha256 by default): builtin trades this service's own
    # clients' isolation from each other for speed, the owner's choice; the pod's cache is its own.
    "--prefix-caching-hash-algo",
    # What vLLM manifests carry over unchanged: the most logprobs a request may ask for (a per-request bound), the
    # request log lines (this pod's log), and --trust-remote-code, which runs no checkpoint code here either way.
    "--max-logprobs", "--enable-log-requests", "--disable-log-requests", "--trust-remote-code",
    # More of them: the request log's prompt length, uvicorn's access log (this pod's log), the chat reply's role,
    # logprobs' token names by default, and the tokenizer mode (auto/hf, how the tokenizer is loaded anyway).
    "--max-log-len", "--disable-uvicorn-access-log", "--disable-access-log-for-endpoints", "--response-role",
    "--return-tokens-as-token-ids", "--tokenizer-mode",
    # No /openapi.json (vLLM's --disable-fastapi-docs): the probes and the scrape are other paths.
    "--disable-fastapi-docs",
    # Fixed meanings here, accepted only at the value that runs (check_value refuses the rest, naming it): one
    # engine per pod (-dp 1; more copies are spec.replicas), ranks as spawned processes (mp), NCCL's all-reduce.
    "--data-parallel-size", "--distributed-executor-backend", "--disable-custom-all-reduce",
    # Keys set over the model's config.json (vLLM's flag): only that dict changes, which names no file and runs no
    # code (an auto_map is refused, the architectures are the engine's own), as a checkpoint of the owner's own would
    # (docs/operator.md); the values are checked by the engine's rules (flotilla/hf_override_values.py), and the
    # fit check and the length rules read spec.model.config with the keys set over it (spec.architecture).
    "--hf-overrides",
    # With the values OPERATOR_OWNED_VALUES allows.
    *OPERATOR_OWNED_VALUES,
})


def _without_model_flag(extra: list[str]) -> tuple[list[str], list[str]]:
    """engineArgs without vLLM's `--model X` / `--model=X` (MODEL, which engine_args renders from spec.model), and
    the refusal of each one found."""
    rest, errors, i = [], [], 0
    while i < len(extra):
        token = extra[i]
        i += 1
        if token == MODEL_FLAG or token.startswith(MODEL_FLAG + "="):
            errors.append(f"spec.engineArgs: {MODEL_FLAG} is set by the operator: it serves spec.model.source")
            if token == MODEL_FLAG and i < len(extra) and not extra[i].startswith("-"):
                i += 1  # its value
            continue
        rest.append(token)
    return rest, errors


def _extra_flags(extra: list[str]) -> tuple[list[ParsedFlag], list[str]]:
    """spec.engineArgs parsed by the engine's grammar and checked by the contract, and why any of
    them cannot be used (grammar, ownership, type, range, implemented)."""
    extra, errors = _without_model_flag(dashed_names(extra))  # `--max_model_len` is the engine's --max-model-len
    if problem := removed_flag_problem(extra):
        return [], [*errors, f"spec.engineArgs: {problem}"]
    try:  # the engine's parser reads vLLM's dotted keys (`-cc.cudagraph_mode FULL`) as the flag's JSON object
        extra = expand_dotted_args(extra, flag_options())
    except ValueError as exc:
        return [], [*errors, f"spec.engineArgs: {exc}"]
    parsed, problems = parse_argv(extra)
    errors += [f"spec.engineArgs: {p}" for p in problems]
    usable, seen = [], set()
    for p in parsed:
        f = p.flag
        if f.crd_field:
            errors.append(f"spec.engineArgs: {f.name} is set by spec.{f.crd_field}; set that field instead")
        elif f.name in OPERATOR_OWNED:
            errors.append(f"spec.engineArgs: {f.name} is set by the operator: {OPERATOR_OWNED[f.name]}")
        elif f.name not in ENGINE_ARGS_ALLOWED:
            errors.append(f"spec.engineArgs: {f.name} cannot be set through engineArgs by this operator version")
        elif f.name in seen:
            errors.append(f"spec.engineArgs: {f.name} is given more than once")
        elif problem := (f.check_value(p.value) or _pod_file_problem(p) or _owned_value_problem(p)
                         or _hf_overrides_problem(p)):
            errors.append(f"spec.engineArgs: {problem}")
        else:
            seen.add(f.name)
            usable.append(p)
    return usable, errors


def _pod_file_problem(p: ParsedFlag) -> str | None:
    """--chat-template must be the template's text here: as a path, the engine would read that file of its pod into
    prompts (the API key's /proc/self/environ too) for whoever may only create InferenceServices."""
    if p.flag.name != "--chat-template" or looks_like_chat_template(str(p.value)):
        return None
    return ("--chat-template must be the template's text (holding {, } or a newline), not a file path: the operator "
            "lets the engine read no file of its pod into prompts; put the file's text in the value")


def _hf_overrides_problem(p: ParsedFlag) -> str | None:
    """The engine's refusal of --hf-overrides values it cannot run whatever the checkpoint (the checks against the
    checkpoint's own config.json wait for the engine, which reads it)."""
    return override_values_problem(p.value) if p.flag.name == "--hf-overrides" else None


def _overridden_config_problem(spec: InferenceServiceSpec) -> str | None:
    """Why spec.model.config with --hf-overrides' keys set over it is no architecture the fit check can read (a
    length beyond its bounds), or None."""
    exc = spec.overridden_architecture()[1]
    if exc is None:
        return None
    where = ", ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return f"spec.engineArgs: --hf-overrides set over spec.model.config: {where}"


def _owned_value_problem(p: ParsedFlag) -> str | None:
    """Why a flag of OPERATOR_OWNED_VALUES cannot have this value."""
    if p.flag.name not in OPERATOR_OWNED_VALUES or p.value in OPERATOR_OWNED_VALUES[p.flag.name][0]:
        return None
    allowed, why = OPERATOR_OWNED_VALUES[p.flag.name]
    return f"{p.flag.name} {p.value} is the operator's to refuse: {why}; it may be {' or '.join(allowed)}"


def engine_args_errors(extra: list[str]) -> list[str]:
    """Why the flags in spec.engineArgs cannot be used, one message each (empty when they can)."""
    return _extra_flags(extra)[1]


def shutdown_timeout(spec: InferenceServiceSpec) -> float:
    """The engine's drain time after SIGTERM: --shutdown-timeout from engineArgs, else its default."""
    usable, errors = _extra_flags(spec.engine_args)
    given = [p.value for p in usable if p.flag.name == "--shutdown-timeout"]
    return float(given[0]) if given and not errors else float(flag("--shutdown-timeout").default)


def _spec_name(dest: str) -> str:
    f = next((f for f in FLAGS if f.dest == dest), None)
    return f"spec.{f.crd_field}" if f is not None and f.crd_field else flag_name(dest)


def _hf_config(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    # The model's length limit, when the spec states it (as the engine derives it: rope scaling, sliding window,
    # with --hf-overrides' keys set over them); the engine reads the rest from config.json.
    arch = spec.architecture
    limit = None if arch is None else arch.length_limit
    return None if limit is None else {"max_position_embeddings": limit}


def _as_offered(flag_: Flag, crd_field: str) -> Flag:
    """The flag as a spec field sees it: its supported values narrowed to those the field's enum offers, so that a
    refusal names only values an InferenceService can give."""
    field_ = InferenceServiceSpec.model_fields.get(crd_field)
    offered = get_args(field_.annotation) if field_ is not None else ()
    if flag_.supported_values is None or not offered:
        return flag_
    return dataclasses.replace(flag_, supported_values=tuple(v for v in flag_.supported_values if v in offered))


def unsupported(spec: InferenceServiceSpec, name: str) -> list[str]:
    """Every reason the engine could not start with this spec, one user-facing message each.

    The rules are the engine's own (the flag contract's types, choices and ranges, and
    flotilla/engine_rules.py across flags), applied to the values this spec renders, so what the
    admission webhook admits, the engine accepts.
    """
    errors, values = [], {}
    for crd_field, value_of in FIELD_VALUES.items():
        flag_ = flag_for_crd_field(crd_field)
        assert flag_ is not None, crd_field
        flag_ = _as_offered(flag_, crd_field)
        value = value_of(spec, name)
        message = flag_.check_value(value)
        if message:
            errors.append(f"spec.{crd_field}: {message}")
        values[flag_.dest] = value
    usable, extra_errors = _extra_flags(spec.engine_args)
    errors += extra_errors
    if not extra_errors and (problem := _overridden_config_problem(spec)):
        errors.append(problem)
    override_problem = not extra_errors and override_method_problem(spec.quantization_config_override,
                                                                    spec.effective_quantization)
    if override_problem:
        errors.append(f"spec.engineArgs: {override_problem}")
    values.update({p.flag.dest: p.value for p in usable})
    if not extra_errors and (problem := act_order_parallel_problem(
            spec.quantization_config_override, values.get("tensor_parallel_size") or 1,
            _spec_name("tensor_parallel_size"))):
        errors.append(f"spec.engineArgs: --hf-overrides: quantization_config: {problem}")
    if not extra_errors and not override_problem and (problem := _fp8_block_problem(spec, values)):
        errors.append(f"spec.engineArgs: --hf-overrides: quantization_config: {problem}")
    if spec.model.gguf_file is not None and (problem := gguf_load_format_problem(values.get("load_format") or "auto")):
        errors.append(f"spec.engineArgs: {problem}")
    if problem := _draft_length_problem(spec):
        errors.append(problem)
    weights = None if spec.weight_quantization == "none" else spec.weight_quantization  # an override's scheme too
    if (arch := spec.architecture) is not None and (problem := moe_problem(
            arch.expert_widths, weights, bool(values.get("enable_lora")),
            values.get("tensor_parallel_size") or 1, _spec_name, spec.quantization_config_override)):
        errors.append(problem)
    return errors + cross_flag_problems(values, _hf_config(spec), _spec_name)


def _fp8_block_problem(spec: InferenceServiceSpec, values: dict[str, Any]) -> str | None:
    """The engine's refusal, when it builds the model, of a block-scaled fp8 quantization_config (--hf-overrides)
    whose blocks the spec's architecture splits between merged shards or tensor-parallel ranks
    (`fp8_block_decoder_problem`); None where the spec states no dense architecture."""
    arch = spec.architecture
    if arch is None or arch.num_experts is not None:
        return None
    block = fp8_block_size(spec.quantization_config_override)  # readable: override_method_problem passed it
    if block is None:
        return None
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    return fp8_block_decoder_problem(block, arch.hidden_size, arch.num_attention_heads,
                                     arch.num_key_value_heads or arch.num_attention_heads, head_dim,
                                     arch.intermediate_size, values.get("tensor_parallel_size") or 1)


def _draft_length_problem(spec: InferenceServiceSpec) -> str | None:
    """The engine's refusal of a draft model shorter than the length served, where the spec states both: its
    speculative.draftConfig's maxPositionEmbeddings (rope-scaled), and scheduling.maxModelLen or the model's own
    length."""
    s = spec.speculative
    draft = s.draft_config if s is not None and s.method == "draft_model" else None
    numbers = draft.length_numbers() if draft is not None else None
    arch = spec.architecture
    target = arch.length_limit if arch is not None else None
    max_model_len = spec.scheduling.max_model_len or target
    if draft is None or draft.rope_positions is None or numbers is None or max_model_len is None:
        return None
    # config.json's keys as draftConfig spells them (rope_scaling.factor: ropeScaling.factor)
    origin = rope_positions_origin(numbers, lambda key: ".".join(to_camel(part) for part in key.split(".")))
    return draft_length_problem(draft.rope_positions, f"spec.speculative.draftConfig.{origin}", max_model_len,
                                spec.scheduling.max_model_len is not None, _spec_name)

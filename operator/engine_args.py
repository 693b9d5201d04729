"""InferenceService spec -> the engine's command line, from the flag contract (flotilla/flags.py).

The engine's command line is the whole contract between the operator and the engine. Every spec
field that sets a flag is listed in `FIELD_VALUES` under the flag's `crd_field`; a test checks that
this table and flags.py name the same fields, so a flag can't gain a CRD field without the operator
knowing how to render it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flotilla.flags import FLAGS, Flag, flag_for_crd_field
from flotilla.operator.names import MODEL_PATH
from flotilla.operator.spec import InferenceServiceSpec

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
    "dtype": lambda s, _: s.dtype,
    "quantization": lambda s, _: None if s.quantization == "none" else s.quantization,
    "kvCache.dtype": lambda s, _: s.kv_cache.dtype,
    "kvCache.blockSize": lambda s, _: s.kv_cache.block_size,
    "kvCache.gpuMemoryUtilization": lambda s, _: s.kv_cache.gpu_memory_utilization,
    "kvCache.prefixCaching": lambda s, _: s.kv_cache.prefix_caching,
    "scheduling.maxModelLen": lambda s, _: s.scheduling.max_model_len,
    "scheduling.maxNumSeqs": lambda s, _: s.scheduling.max_num_seqs,
    "scheduling.maxNumBatchedTokens": lambda s, _: s.scheduling.max_num_batched_tokens,
    "scheduling.chunkedPrefill": lambda s, _: s.scheduling.chunked_prefill,
    "parallelism.tensor": lambda s, _: s.parallelism.tensor,
    "parallelism.pipeline": lambda s, _: s.parallelism.pipeline,
    "speculative": lambda s, _: _speculative_config(s),
    "lora": lambda s, _: s.lora is not None,
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
    """The engine's arguments after `flotilla serve`: MODEL, then one flag per set field, then engineArgs."""
    args = [MODEL_PATH]
    for crd_field, value_of in FIELD_VALUES.items():
        flag = flag_for_crd_field(crd_field)
        assert flag is not None, crd_field  # the contract test keeps FIELD_VALUES and flags.py in step
        value = value_of(spec, name)
        if _is_sent(flag, value):
            args += _render(flag, value)
    return args + list(spec.engine_args)


def _flag_named(token: str) -> Flag | None:
    name = token.split("=", 1)[0]
    for f in FLAGS:
        if name == f.name or name in f.aliases or (f.negatable and name == f.name.replace("--", "--no-", 1)):
            return f
    return None


def engine_args_errors(extra: list[str]) -> list[str]:
    """Why each flag in spec.engineArgs cannot be used (unknown, set by a field, or not implemented)."""
    errors = []
    for token in extra:
        if not token.startswith("-") or _is_number(token):
            continue  # a flag's value
        f = _flag_named(token)
        if f is None:
            errors.append(f"spec.engineArgs: {token.split('=', 1)[0]} is not an engine flag")
        elif f.crd_field:
            errors.append(f"spec.engineArgs: {f.name} is set by spec.{f.crd_field}; set that field instead")
        elif not f.implemented:
            errors.append(f"spec.engineArgs: {f.name} is not implemented yet in this Flotilla version")
    return errors


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def unsupported(spec: InferenceServiceSpec, name: str) -> list[str]:
    """Every reason the engine could not start with this spec today, one user-facing message each.

    Empty when the spec only uses implemented flags with supported values. The admission webhook
    refuses a spec with any message here, so no pod crash-loops on an unknown flag.
    """
    errors = []
    for crd_field, value_of in FIELD_VALUES.items():
        flag = flag_for_crd_field(crd_field)
        assert flag is not None, crd_field
        message = flag.check_value(value_of(spec, name))
        if message:
            errors.append(f"spec.{crd_field}: {message}")
    return errors + engine_args_errors(spec.engine_args)

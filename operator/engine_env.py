"""The engine's environment switches: which of them spec.pod.env may set.

The engine reads some settings from its environment (vLLM's convention) as well as from its command line. The
operator governs the command line: spec.engineArgs is an allow-list with checked values (engine_args.py). A variable
that does what a flag does, or turns on what no allowed flag may, would get around that, so spec.pod.env may not name:

- a flag's environment variable (flags.py's `env`, e.g. VLLM_HTTP_TIMEOUT_KEEP_ALIVE for --timeout-keep-alive): the
  flag, given where the operator reads it, has its value checked (an unchecked one crash-loops the engine at
  start-up); the refusal says where to set it instead;
- VLLM_ALLOW_RUNTIME_LORA_UPDATING, vLLM's switch for the runtime adapter routes (/v1/load_lora_adapter): they let
  the model's API clients load any directory of the pod as an adapter, which no engineArgs flag may turn on.
  Adapters are listed in spec.lora.adapters instead;
- VLLM_SERVER_DEV_MODE, vLLM's switch for its development routes (/sleep, /wake_up): they let the model's API
  clients take the model off the GPU.

Every other variable the engine reads is the pod's own business (ENGINE_ENV_ALLOWED says why, name by name); the
kernels' FLOTILLA_* switches (kernels/) choose among implementations of the same computation, which their tests hold
equal. tests/operator/test_engine_env.py reads every variable engine/ and flotilla/ read and checks each is classified
here, as a flag added to the engine is refused until engine_args.py classifies it.

A Secret's or ConfigMap's keys are not known at admission, so an envFrom prefix that could spell a refused name (or
the operator's VLLM_API_KEY, which it sets only with apiKeySecretRef) is refused too.
"""

from __future__ import annotations

from flotilla.flags import FLAGS, Flag
from flotilla.operator.engine_args import ENGINE_ARGS_ALLOWED, OPERATOR_OWNED

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"

# The engine's variables that spec.pod.env may set, and why each changes nothing the operator governs.
ENGINE_ENV_ALLOWED: dict[str, str] = {
    "VLLM_LOGGING_LEVEL": "this pod's log",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "the engine core in a process or a thread of the server: the same routes",
    "FLOTILLA_RESPONSES_STORE_BYTES": "the memory of this pod's Responses store, within the pod's own limit",
    "VLLM_XGRAMMAR_CACHE_MB": "the memory of this pod's grammar cache, within the pod's own limit",
    "FLOTILLA_STEP_TRACE": "a trace file written in this pod",
    "PYTHONHASHSEED": "the prefix cache's hash seed, as --prefix-caching-hash-algo: this pod's cache",
    "RTN_NUM_BITS": "--quantization rtn's bits, checked by the review (engine_rules.rtn_settings)",
    "RTN_GROUP_SIZE": "--quantization rtn's group size, checked by the review (engine_rules.rtn_settings)",
    "FLOTILLA_CACHE": "where the embedded model is cached in this pod",
    "TRITON_INTERPRET": "runs the Triton kernels in Triton's interpreter: slower, the same results",
    # The engine's A/B switches: each turns one speed-up off for its before/after figure, the results the same.
    "FLOTILLA_CORE_OUTPUT_THREAD": "the core's outputs sent from a thread or the step loop: the same messages",
    "FLOTILLA_API_SWITCH_INTERVAL": "the API process's GIL switch interval (seconds): the same replies",
    "FLOTILLA_GGUF_CPU_HEAD": "a GGUF model's LM head on the CPU path or the dense one: the same logits",
    "FLOTILLA_CPU_DECODE_LAYERS": "the CPU decode memo or the module path: the same computation",
    "FLOTILLA_ONE_SEQ_GRAPHS": "whether one-sequence CUDA graphs are captured: the same computation",
}


def _flag_env() -> dict[str, Flag]:
    return {f.env: f for f in FLAGS if f.env}


def _instead(flag: Flag) -> str:
    """Where the flag that `flag.env` stands for is set in an InferenceService."""
    if flag.crd_field:
        return f"spec.{flag.crd_field} sets it; set that field instead"
    if flag.name in ENGINE_ARGS_ALLOWED:
        return f"give {flag.name} in spec.engineArgs instead, where its value is checked"
    reason = OPERATOR_OWNED.get(flag.name, "spec.engineArgs does not allow it")
    return f"InferenceServices cannot set it: {reason}"


def engine_env_problem(name: str) -> str | None:
    """Why spec.pod.env may not set the variable `name`, or None when it is not an engine switch the operator
    governs."""
    flag = _flag_env().get(name)
    if flag is not None:
        return f"{name} is the engine's {flag.name}: {_instead(flag)}"
    if name == RUNTIME_LORA_ENV:
        return (f"{name} would turn on the engine's runtime adapter routes (/v1/load_lora_adapter), which let the "
                "model's API clients load any directory of the pod as an adapter; list the adapters in "
                "spec.lora.adapters instead")
    if name == DEV_MODE_ENV:
        return (f"{name} would turn on the engine's development routes (/sleep, /wake_up), which let the model's API "
                "clients take the model off the GPU; no InferenceService serves them")
    return None


def refused_names() -> list[str]:
    """Every engine variable spec.pod.env may not set (the flags' own, VLLM_API_KEY included)."""
    return sorted([*_flag_env(), RUNTIME_LORA_ENV, DEV_MODE_ENV])


def env_from_prefix_problem(prefix: str) -> str | None:
    """Why an envFrom with `prefix` could set an engine switch (a key of the source could complete the name), or
    None."""
    spelled = [name for name in refused_names() if name.startswith(prefix)]
    if not prefix or not spelled:
        return None
    return (f"with the prefix {prefix!r}, a key of the Secret or ConfigMap could name {', '.join(spelled)}, engine "
            "settings spec.pod.env may not set either; give a prefix none of them starts with (e.g. APP_)")

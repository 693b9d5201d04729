"""What a config.json's `quantization_config` tells the engine about its linear weights, read without torch: the
scheme it names (`quant_method`), the bits of a weight, GPTQ/AWQ's group size and compressed-tensors' one config
group and its group size.

The engine runs the scheme the checkpoint's quantization_config names (engine/quantization `resolve_quantization`),
and an --hf-overrides `quantization_config` replaces the checkpoint's whole before that. The engine's scheme modules
(engine/quantization gptq.py, awq.py, compressed_tensors.py) read these fields with the functions here, and the
operator reads an override's with the same ones: the fit check counts the weights at its bits and their scales by
its group size, and the webhook refuses what the engine would refuse at start-up, with the engine's words (the
ValueError these functions raise).
Each scheme's layout details (desc_act, AWQ's version, compressed-tensors' targets and strategies) stay with the
engine's module.

Standard library only (the operator's webhook imports it).
"""

from __future__ import annotations

from typing import Any

# The schemes a checkpoint's quantization_config may name for the engine to load (rtn quantizes a dense checkpoint
# at load, and the engine refuses it over a quantized one), and the bits of a weight each loads.
CHECKPOINT_BITS = {"fp8": (8,), "compressed-tensors": (4, 8), "gptq": (4, 8), "awq": (4,)}
CHECKPOINT_METHODS = tuple(CHECKPOINT_BITS)


def describes_checkpoint(qcfg: Any) -> bool:
    """Whether a quantization_config says how the checkpoint's weights are stored: an object, and not gguf's (a model
    transformers read from a GGUF file and saved again keeps `quant_method: gguf`, but its safetensors hold the
    dequantized weights). One without quant_method does (dense weights; `flag_disagrees`)."""
    return isinstance(qcfg, dict) and _method_text(qcfg) != "gguf"


def config_method(qcfg: Any) -> str | None:
    """The scheme a quantization_config names (its quant_method, lower-cased), or None where the engine loads the
    weights as they are: no object, no (or an empty or null) quant_method, or gguf (`describes_checkpoint`)."""
    if not describes_checkpoint(qcfg):
        return None
    return _method_text(qcfg) or None


def flag_disagrees(qcfg: Any, flag: str | None) -> bool:
    """Whether a --quantization `flag` (None: not given) and a quantization_config name different schemes, which
    the engine refuses to start with. One without quant_method names none, and disagrees with any flag, as vLLM's
    config check has it (its quant_method, None, is not the flag's)."""
    return flag is not None and describes_checkpoint(qcfg) and flag != config_method(qcfg)


def weight_bits(qcfg: Any) -> int | None:
    """Bits of a linear weight under a quantization_config, as the engine loads them: compressed-tensors' config
    group's weights.num_bits (an integer), GPTQ's bits and AWQ's bits or w_bit (int() of the value, so `true` is 1 and
    "8" is 8; 4 when absent), fp8's 8; None for no scheme or another one. ValueError, naming the value, for bits
    that are no number or that the scheme does not load (`CHECKPOINT_BITS`)."""
    method = config_method(qcfg)
    if method == "fp8":
        return 8
    if method in ("gptq", "awq"):
        value = _packed_bits_value(qcfg, method)
        bits = _engine_int(value)
        if bits is None:
            raise ValueError(f"{method}'s bits {value!r} is not a number of bits")
    elif method == "compressed-tensors":
        value = compressed_tensors_group(qcfg)["weights"].get("num_bits")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"compressed-tensors: weights' num_bits {value!r} is not a number of bits")
        bits = value
    else:
        return None
    if bits not in CHECKPOINT_BITS[method]:
        raise ValueError(f"{method} with {bits}-bit weights is not supported "
                         f"({' or '.join(map(str, CHECKPOINT_BITS[method]))} bits)")
    return bits


def config_weight_bits(qcfg: Any) -> int | None:
    """`weight_bits`, or None where the engine refuses the quantization_config's bits (the fit check's reading: the
    webhook refuses such a spec)."""
    try:
        return weight_bits(qcfg)
    except ValueError:
        return None


def packed_group_size(qcfg: dict[str, Any]) -> int | None:
    """Inputs a GPTQ or AWQ scale group spans, as the engine reads it: int() of group_size (AWQ's also
    q_group_size), -1 for GPTQ and 128 for AWQ when absent; None for one group a row (0 or less). ValueError for a
    value that is no number."""
    if config_method(qcfg) == "awq":
        value = qcfg.get("group_size", qcfg.get("q_group_size", 128))
    else:
        value = qcfg.get("group_size", -1)
    size = _engine_int(value)
    if size is None:
        raise ValueError(f"{config_method(qcfg)}'s group_size {value!r} is not a number of inputs")
    return size if size > 0 else None


def compressed_tensors_group(qcfg: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors' one config group (its targets, weights and input_activations), whose `weights` is an
    object. ValueError where config_groups holds another number of groups, or the group no weights object."""
    groups = qcfg.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise ValueError(f"compressed-tensors: config_groups is a {type(groups).__name__}, not an object of groups")
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: {len(groups)} config groups; one group over the linear layers "
                         "is supported")
    name, group = next(iter(groups.items()))
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        raise ValueError(f"compressed-tensors: config group {name!r} has no weights object")
    return group


def compressed_tensors_group_size(weights: dict[str, Any]) -> int | None:
    """Inputs a scale group of compressed-tensors' integer weights spans, as the engine reads its config group's
    `weights`: group_size under strategy "group", None (one group a row) under any other. ValueError where strategy
    "group" has no positive integer group_size."""
    if weights.get("strategy") != "group":
        return None
    size = weights.get("group_size")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"compressed-tensors: weights' group_size {size!r} is not a number of inputs "
                         "(strategy group)")
    return size


def override_method_problem(qcfg: Any, quantization: str, field: str = "spec.quantization") -> str | None:
    """Why the engine would refuse to start with an --hf-overrides `quantization_config` of `qcfg` beside the
    --quantization it is given (`quantization`, "none" for none; `field` names where it is set), or None."""
    method = config_method(qcfg)
    flag = None if quantization == "none" else quantization
    if method is None:
        if not flag_disagrees(qcfg, flag):
            return None
        return (f"--hf-overrides: quantization_config has no quant_method, which does not match {field} "
                f"{quantization}; the engine refuses to start with both: leave {field} out or name the scheme in "
                "quant_method")
    if method not in CHECKPOINT_METHODS:
        return (f"--hf-overrides: quantization_config's quant_method {method!r} is not one the engine loads a "
                f"checkpoint with (supported: {', '.join(CHECKPOINT_METHODS)})")
    if flag_disagrees(qcfg, flag):  # checked first, as the engine does
        return (f"--hf-overrides: quantization_config's quant_method {method!r} does not match {field} "
                f"{quantization}; the engine refuses to start with both: leave {field} out or make them agree")
    try:
        weight_bits(qcfg)
        if method in ("gptq", "awq"):
            packed_group_size(qcfg)
        elif method == "compressed-tensors":
            compressed_tensors_group_size(compressed_tensors_group(qcfg)["weights"])
    except ValueError as exc:  # the engine's own refusal of it, in its words
        return f"--hf-overrides: quantization_config: {exc}"
    return None


def _method_text(qcfg: dict[str, Any]) -> str:
    """quant_method lower-cased, "" where it is absent, empty or null."""
    return str(qcfg.get("quant_method") or "").lower()


def _packed_bits_value(qcfg: dict[str, Any], method: str) -> Any:
    """GPTQ's `bits`, AWQ's `bits` or `w_bit`, 4 when absent."""
    return qcfg.get("bits", qcfg.get("w_bit", 4)) if method == "awq" else qcfg.get("bits", 4)


def _engine_int(value: Any) -> int | None:
    """`int(value)` as the engine takes GPTQ/AWQ numbers (so `true` is 1 and "4" is 4), None where that fails."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None

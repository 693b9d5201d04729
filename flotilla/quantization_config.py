"""What a config.json's `quantization_config` tells the engine about its linear weights, read without torch: the
scheme it names (`quant_method`) and the bits of a weight.

The engine runs the scheme the checkpoint's quantization_config names (engine/quantization `resolve_quantization`),
and an --hf-overrides `quantization_config` replaces the checkpoint's whole before that. So the operator reads an
override's with these functions: the fit check counts the weights at its bits, and the webhook refuses a scheme the
engine would refuse at start-up.

Standard library only (the operator's webhook imports it).
"""

from __future__ import annotations

from typing import Any

# The schemes a checkpoint's quantization_config may name for the engine to load (rtn quantizes a dense checkpoint
# at load, and the engine refuses it over a quantized one), and the bits of a weight each loads.
CHECKPOINT_BITS = {"fp8": (8,), "compressed-tensors": (4, 8), "gptq": (4, 8), "awq": (4,)}
CHECKPOINT_METHODS = tuple(CHECKPOINT_BITS)


def config_method(qcfg: Any) -> str | None:
    """The scheme a quantization_config names (its quant_method, lower-cased), or None where the engine loads the
    weights as they are: no object, no quant_method, or gguf (a model transformers read from a GGUF file and saved
    again: its safetensors hold the dequantized weights)."""
    if not isinstance(qcfg, dict):
        return None
    method = str(qcfg.get("quant_method") or "").lower()
    return None if method in ("", "gguf") else method


def config_weight_bits(qcfg: Any) -> int | None:
    """Bits of a linear weight under a quantization_config, as the engine reads them: compressed-tensors' one config
    group's weights.num_bits, GPTQ's bits and AWQ's bits or w_bit (4 when absent), fp8's 8; None where it does not
    say (another scheme, or a shape the engine refuses anyway)."""
    method = config_method(qcfg)
    if method == "fp8":
        return 8
    if method in ("gptq", "awq"):  # read as the engine reads them: int() of the value (engine/quantization/gptq.py)
        return _engine_int(_packed_bits_value(qcfg, method))
    if method == "compressed-tensors":
        groups = qcfg.get("config_groups")
        if not isinstance(groups, dict) or len(groups) != 1:
            return None
        group = next(iter(groups.values()))
        weights = group.get("weights") if isinstance(group, dict) else None
        bits = weights.get("num_bits") if isinstance(weights, dict) else None
        return bits if isinstance(bits, int) and not isinstance(bits, bool) else None
    return None


def override_method_problem(qcfg: Any, quantization: str, field: str = "spec.quantization") -> str | None:
    """Why the engine would refuse to start with an --hf-overrides `quantization_config` of `qcfg` beside the
    --quantization it is given (`quantization`, "none" for none; `field` names where it is set), or None."""
    method = config_method(qcfg)
    if method is None:
        return _no_method_problem(qcfg, quantization, field)
    if method not in CHECKPOINT_METHODS:
        return (f"--hf-overrides: quantization_config's quant_method {method!r} is not one the engine loads a "
                f"checkpoint with (supported: {', '.join(CHECKPOINT_METHODS)})")
    bits = config_weight_bits(qcfg)
    if bits is None and method in ("gptq", "awq"):  # int() fails on it in the engine too
        return (f"--hf-overrides: quantization_config: {method}'s bits {_packed_bits_value(qcfg, method)!r} is not "
                f"a number of bits the engine reads")
    if bits is not None and bits not in CHECKPOINT_BITS[method]:
        return (f"--hf-overrides: quantization_config: {method} with {bits}-bit weights is not one the engine loads "
                f"({' or '.join(map(str, CHECKPOINT_BITS[method]))} bits)")
    if quantization not in ("none", method):
        return (f"--hf-overrides: quantization_config's quant_method {method!r} does not match {field} "
                f"{quantization}; the engine refuses to start with both: leave {field} out or make them agree")
    return None


def _no_method_problem(qcfg: Any, quantization: str, field: str) -> str | None:
    """A quantization_config that names no scheme loads dense weights, but beside a --quantization it is refused, as
    vLLM's config check does (its quant_method, None, does not match the flag's); gguf's names its dequantized
    weights (`config_method`), not refused."""
    if quantization == "none" or not isinstance(qcfg, dict) or qcfg.get("quant_method"):
        return None
    return (f"--hf-overrides: quantization_config has no quant_method, which does not match {field} {quantization}; "
            f"the engine refuses to start with both: leave {field} out or name the scheme in quant_method")


def _packed_bits_value(qcfg: dict[str, Any], method: str) -> Any:
    """GPTQ's `bits`, AWQ's `bits` or `w_bit`, 4 when absent, as the engine's gptq.py / awq.py look them up."""
    return qcfg.get("bits", qcfg.get("w_bit", 4)) if method == "awq" else qcfg.get("bits", 4)


def _engine_int(value: Any) -> int | None:
    """`int(value)` as the engine takes GPTQ/AWQ bits (so `true` is 1 and "4" is 4), None where that fails."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None

"""The rope scalings the engine's rotary embedding computes (engine/layers/rotary.py), and why a config.json value of
`rope_scaling` or `rope_parameters` it cannot compute is refused: the check --hf-overrides applies to an override (a
checkpoint's own config.json is trusted), so that an unknown type or a missing factor is a usage error at start-up
rather than a failure inside the engine process once the server has started.

Standard library only: the operator's webhook applies the same check to spec.engineArgs' --hf-overrides.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Each rope type the rotary embedding computes -> the keys it cannot do without (yarn derives its own from the
# model's length when they are absent, as transformers does).
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (),
}
# The keys the rotary embedding reads as numbers: each, where given, must be a positive finite number.
_POSITIVE = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim")


def rope_type(scaling: dict[str, Any]) -> Any:
    """The rope type `scaling` names (`rope_type`, or transformers' older `type`; default when neither)."""
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_scaling_problem(scaling: Any) -> str | None:
    """Why the rotary embedding cannot compute the frequencies of `scaling` (a rope_scaling or rope_parameters
    object), or None."""
    if not isinstance(scaling, dict):
        return f"must be a JSON object, not {json.dumps(scaling)}"
    kind = rope_type(scaling)
    if not isinstance(kind, str) or kind not in ROPE_TYPES:  # a list or an object is unhashable: no `in` for it
        return f"rope type {json.dumps(kind)} is not one the engine computes ({', '.join(ROPE_TYPES)})"
    if missing := [key for key in ROPE_TYPES[kind] if scaling.get(key) is None]:
        return f"rope type {kind} needs {', '.join(missing)}"
    for key in _POSITIVE:
        value = scaling.get(key)
        if value is not None and not _positive(value):
            return f"{key} must be a positive number, not {json.dumps(value)}"
    original = scaling.get("original_max_position_embeddings")
    if original is not None and not (isinstance(original, int) and not isinstance(original, bool) and original > 0):
        return f"original_max_position_embeddings must be a positive integer, not {json.dumps(original)}"
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        return (f"high_freq_factor {scaling['high_freq_factor']} must be more than low_freq_factor "
                f"{scaling['low_freq_factor']} (llama3's ramp runs between them)")
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0

"""Every rule an InferenceService spec must pass, as one pure function.

The validating webhook (webhook.py) refuses a spec with any error here, and the reconciler
(reconciler.py) applies the same review, so a spec that slipped past the webhook (failure policy
Ignore while the operator is down) is still never rolled out: it is reported in status instead.

The rules the 1.20 apiserver cannot express (no CEL): the cross-field rules of the spec model
(GPUs = tensor x pipeline, autoscaling min <= max, ...), the fp8 KV cache's dtype, engine flags
that are not implemented yet (flotilla/flags.py through engine_args.unsupported), and the fit
check's hopeless cases. A spec that fits with a warning is admitted, with the warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flotilla.operator.engine_args import unsupported
from flotilla.operator.fit import FitReport, check_fit
from flotilla.operator.spec import InferenceServiceSpec


@dataclass
class Review:
    """The outcome: errors refuse the spec, warnings are shown to the user; spec and fit when parsed."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spec: InferenceServiceSpec | None = None
    fit: FitReport | None = None

    @property
    def message(self) -> str:
        """All errors in one line, as the webhook returns them and the Valid condition shows them."""
        return "; ".join(self.errors)


def _pydantic_errors(error: ValidationError) -> list[str]:
    out = []
    for e in error.errors():
        message = e["msg"].removeprefix("Value error, ")
        loc = ".".join(str(part) for part in e["loc"])
        out.append(f"spec.{loc}: {message}" if loc else message)
    return out


def _dtype_rules(spec: InferenceServiceSpec) -> list[str]:
    if spec.kv_cache.dtype.startswith("fp8") and spec.dtype == "float32":
        return [f"spec.kvCache.dtype: {spec.kv_cache.dtype} needs 16-bit activations; set spec.dtype to "
                "bfloat16, float16 or auto, or spec.kvCache.dtype to auto"]
    return []


def review(spec: dict[str, Any], name: str) -> Review:
    """Check a spec (as on the wire, camelCase) of the InferenceService `name`."""
    try:
        parsed = InferenceServiceSpec.model_validate(spec)
    except ValidationError as e:
        return Review(errors=_pydantic_errors(e))
    result = Review(spec=parsed, errors=_dtype_rules(parsed) + unsupported(parsed, name))
    result.fit = check_fit(parsed)
    if result.fit.verdict == "DoesNotFit":
        result.errors.append(f"fit check: {result.fit.message}")
    elif result.fit.verdict == "FitsWithWarning":
        result.warnings.append(f"fit check: {result.fit.message}")
    return result

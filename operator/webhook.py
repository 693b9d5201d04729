"""The admission webhooks, served by kopf: validation (admission.review) and two useful defaults.

Failure policy: **Ignore**, for both webhooks. When the operator is down (upgrading, crashed,
SIGKILLed before kopf could withdraw its webhook configurations), InferenceServices can still be
created, edited and deleted; nothing unsafe follows, because the reconciler applies the same
review before it applies anything and reports a refused spec in status (Valid=False, reason
InvalidSpec) instead of rolling it out. With Fail, an operator outage would block every change to
every InferenceService, deletes included, for as long as it lasts.

Namespaces: the webhook configurations match InferenceServices in every namespace, but an operator
started with --namespace serves only those: elsewhere its webhooks admit everything unchanged, so
another release's namespaces (other admin policy, other engine image) are left to that release.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Literal

import kopf
from pydantic import ValidationError

from flotilla.engine_rules import world_size
from flotilla.operator.admission import replicas_notes, review
from flotilla.operator.policy import AdmissionPolicy
from flotilla.operator.spec import GROUP, PLURAL, VERSION, ParallelismSpec

OPERATIONS: list[Literal["CREATE", "UPDATE"]] = ["CREATE", "UPDATE"]  # never DELETE: deleting must always work


def _name(body: Any) -> str:
    meta = body.get("metadata", {})
    return meta.get("name") or meta.get("generateName") or ""


def spec_untouched(operation: str | None, old: Any, body: Any) -> bool:
    """Whether the request is an UPDATE that leaves the spec as stored (labels, annotations, finalizers only).

    Such an update is neither reviewed nor defaulted: a stored spec that today's rules refuse (admitted while the
    operator was down, or valid under an older operator or policy) must still take kopf's annotations, a label,
    and the garbage collector's removal of its foregroundDeletion finalizer, or it could never be deleted that
    way; its refusal is in status already.
    """
    return operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec")


def serves(namespace: str | None, namespaces: list[str]) -> bool:
    """Whether an operator started with `namespaces` (--namespace globs; none: all) serves InferenceServices in
    `namespace`. A request whose object names no namespace (a 1.20 apiserver leaves it empty when the client did;
    1.22+ fills it in) is served, as before: reviewing a stranger's spec is the safe side."""
    return not namespaces or not namespace or any(fnmatch.fnmatchcase(namespace, ns) for ns in namespaces)


def register(registry: kopf.OperatorRegistry, policy: AdmissionPolicy, namespaces: list[str]) -> None:
    """Add the webhook handlers to `registry`; `policy` is the admin's (the reconciler holds the same), and
    `namespaces` the operator's (--namespace): InferenceServices elsewhere are admitted untouched."""

    @kopf.on.validate(GROUP, VERSION, PLURAL, id="validate", operations=OPERATIONS, ignore_failures=True,
                      registry=registry)
    def validate(body: kopf.Body, warnings: list[str], **kwargs: Any) -> None:
        """Refuse a spec that breaks a cross-field rule, an engine-flag rule or the fit check."""
        if spec_untouched(kwargs.get("operation"), kwargs.get("old"), body) or not serves(kwargs.get("namespace"),
                                                                                          namespaces):
            return
        name = _name(body)
        result = review(dict(body.get("spec") or {}), name, policy)
        warnings.extend(result.warnings)
        if result.spec is not None:
            old = kwargs.get("old")
            warnings.extend(replicas_notes(result.spec, None if old is None else old.get("spec") or {}))
        if result.errors:
            raise kopf.AdmissionError(f"InferenceService {name} is invalid: {result.message}", code=422)

    @kopf.on.mutate(GROUP, VERSION, PLURAL, id="default", operations=OPERATIONS, ignore_failures=True,
                    registry=registry)
    def default(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        """Write two implicit defaults into the spec, so `kubectl get fis` shows MODEL and GPUS.

        model.servedName defaults to the object's name; resources.gpusPerReplica to
        tensor x pipeline. (The apiserver has already filled the schema's own defaults.)
        """
        spec = body.get("spec") or {}
        if not isinstance(spec, Mapping) or spec_untouched(kwargs.get("operation"), kwargs.get("old"), body):
            return
        if not serves(kwargs.get("namespace"), namespaces):
            return
        name = body.get("metadata", {}).get("name")
        if name and isinstance(spec.get("model"), dict) and not spec["model"].get("servedName"):
            patch.setdefault("spec", {}).setdefault("model", {})["servedName"] = name
        resources = spec.get("resources")
        if isinstance(resources, Mapping | None) and (resources or {}).get("gpusPerReplica") is None:
            try:
                parallelism = ParallelismSpec.model_validate(spec.get("parallelism") or {})
            except ValidationError:
                return  # mutating webhooks run before schema validation: leave the refusal to the validator
            gpus = world_size(parallelism.tensor, parallelism.pipeline)
            patch.setdefault("spec", {}).setdefault("resources", {})["gpusPerReplica"] = gpus

"""The InferenceService CustomResourceDefinition, generated from the pydantic models.

`crds/inferenceservices.serving.flotilla.dev.yaml` is this function's output, committed so that
Helm and kubectl can use it; a test fails when the two differ. Regenerate with
`python -m flotilla.operator.crd > crds/inferenceservices.serving.flotilla.dev.yaml`.

The conversion turns pydantic's JSON Schema into a structural openAPIV3Schema: `$ref`s inlined,
`X | None` made optional, `int | str` made `x-kubernetes-int-or-string`, and every nested object
with defaults given `default: {}` so the apiserver fills its fields in when the user leaves the
whole object out.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel

from flotilla.operator.spec import GROUP, KIND, PLURAL, VERSION, InferenceServiceSpec
from flotilla.operator.status import InferenceServiceStatus

SHORT_NAMES = ["fis"]
CATEGORIES = ["flotilla", "all"]
_DROP = {"title", "additionalProperties", "examples", "$defs"}

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "Whether every replica serves."},
    # Why not (or since when all is well): a pod problem (ImagePullBackOff, CrashLoopBackOff, Unschedulable ...),
    # ReplicasNotReady, ScaledToZero, a refused spec. The READY column alone says only False.
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
     "description": "The Ready condition's reason."},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas",
     "description": "Ready engine pods."},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.servedName",
     "description": "Served model name (empty: the InferenceService's name)."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "GPUs of all replicas."},
    # Live figures (status.serving, written by the serving reader): is it keeping up?
    {"name": "Queue", "type": "integer", "jsonPath": ".status.serving.waiting",
     "description": "Requests waiting for admission, all replicas."},
    {"name": "KV %", "type": "number", "jsonPath": ".status.serving.kvCacheUsagePercent",
     "description": "KV-cache use, replicas' mean."},
    {"name": "Tok/s", "type": "number", "jsonPath": ".status.serving.generationTokensPerSecond",
     "description": "Generation tokens per second over the window, all replicas."},
    {"name": "TTFT-P95", "type": "number", "jsonPath": ".status.serving.ttftP95Seconds",
     "description": "Time to first token p95 over the window, seconds."},
    {"name": "URL", "type": "string", "jsonPath": ".status.url", "description": "In-cluster URL."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _convert(node: dict[str, Any], defs: dict[str, Any], with_defaults: bool) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return _convert({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs, with_defaults)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default", *_DROP)}
        if {o.get("type") for o in options} == {"integer", "string"}:
            return {**rest, "x-kubernetes-int-or-string": True}
        if len(options) != 1:
            raise ValueError(f"cannot express {node} in a structural schema")
        return _convert({**options[0], **rest}, defs, with_defaults)
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROP and k != "default"}
    if "exclusiveMinimum" in out:  # JSON Schema 2020 number -> OpenAPI 3.0 boolean form
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    if with_defaults and "default" in node and node["default"] is not None:
        out["default"] = node["default"]
    if out.get("type") == "object":
        if "properties" in node:
            out["properties"] = {name: _convert(prop, defs, with_defaults)
                                 for name, prop in node["properties"].items()}
            if with_defaults:
                required = set(node.get("required", ()))
                for name, prop in out["properties"].items():
                    # A nested object made by default_factory: default it to {} so its own field
                    # defaults apply when the user omits it (pydantic does not write this default).
                    if (name not in required and prop.get("type") == "object" and "default" not in prop
                            and "properties" in prop and not _is_optional(node["properties"][name])):
                        prop["default"] = {}
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = _convert(node["additionalProperties"], defs, with_defaults)
    if out.get("type") == "array":
        out["items"] = _convert(node["items"], defs, with_defaults)
    if out.get("type") == "number" and "default" in out:
        out["default"] = float(out["default"])
    return out


def _is_optional(node: dict[str, Any]) -> bool:
    return any(o.get("type") == "null" for o in node.get("anyOf", ()))


def openapi_schema(model: type[BaseModel], with_defaults: bool = True) -> dict[str, Any]:
    """A structural openAPIV3Schema for a pydantic model (camelCase field names)."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(schema, schema.get("$defs", {}), with_defaults)


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition `inferenceservices.serving.flotilla.dev` (v1alpha1, namespaced)."""
    spec_schema = openapi_schema(InferenceServiceSpec)
    status_schema = openapi_schema(InferenceServiceStatus, with_defaults=False)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": SHORT_NAMES, "categories": CATEGORIES},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An OpenAI-compatible LLM endpoint served by Flotilla engine replicas.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string", "description": "API version of this object."},
                        "kind": {"type": "string", "description": "InferenceService."},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                }},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": PRINTER_COLUMNS,
            }],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed under crds/."""
    header = ("# Generated by `python -m flotilla.operator.crd` from operator/spec.py and status.py; "
              "do not edit.\n")
    return header + yaml.dump(build_crd(), Dumper=_NoAliases, sort_keys=False, width=110)


class _NoAliases(yaml.SafeDumper):
    """Writes repeated lists in full instead of as YAML anchors, for readers of the file."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


if __name__ == "__main__":
    sys.stdout.write(crd_yaml())

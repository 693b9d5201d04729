"""What the apiserver would refuse in the scheduling fields the spec passes through to the pods.

spec.pod.affinity and spec.pod.topologySpreadConstraints are the core/v1 objects, kept free-form in the CRD (so a
field of a newer Kubernetes passes), and spec.resources.tolerations the core/v1 Toleration. The apiserver checks
them only when the operator applies the Deployment, after admission, and its refusal reached status as
ApplyRefused. These are its rules (Kubernetes 1.20 pkg/apis/core/validation: validateAffinity, ValidateTolerations,
validateTopologySpreadConstraints), wrong JSON types included, so the webhook refuses such a spec with the field
named; tests/operator/test_scheduling_rules.py checks each case against the real apiserver's answer. Fields these
rules do not know are left to the apiserver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from flotilla.operator.names import label_key_problem, label_problems, label_value_problem
from flotilla.operator.spec import Toleration

INT32_MAX = 2**31 - 1
NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
# The one node field a node selector term's matchFields may name (the node's name).
NODE_NAME_FIELD = "metadata.name"
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class _Problems(list[str]):
    """Problems found so far, each prefixed with the path of the value it is about."""

    def add(self, path: str, problem: str) -> None:
        self.append(f"{path}: {problem}")


def _object(value: Any, path: str, out: _Problems) -> dict[str, Any]:
    """`value` as an object ({} when absent or null, as Go reads it); a problem when it is something else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        out.add(path, "must be an object")
        return {}
    return value


def _list(value: Any, path: str, out: _Problems) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        out.add(path, "must be a list")
        return []
    return value


def _string(value: Any, path: str, out: _Problems) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        out.add(path, "must be a string")
        return ""
    return value


def _strings(value: Any, path: str, out: _Problems) -> list[str]:
    return [_string(v, f"{path}[{i}]", out) for i, v in enumerate(_list(value, path, out))]


def _int32(value: Any, path: str, out: _Problems) -> int | None:
    # Go decodes these into an int32: a fraction, a string or a boolean is refused, and so is anything past 2^31-1.
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not -INT32_MAX - 1 <= value <= INT32_MAX:
        out.add(path, "must be a 32-bit integer")
        return None
    return value


def _key(key: str, path: str, out: _Problems) -> None:
    if problem := label_key_problem(key):
        out.add(path, f"{key!r} is not a valid label key: {problem}")


def _namespace_problem(name: str) -> str | None:
    if len(name) <= 63 and _DNS_1123_LABEL.fullmatch(name):
        return None
    return (f"{name!r} is not a namespace name: at most 63 lower-case letters, digits and '-', starting and ending "
            "with a letter or digit")


def _node_name_problem(name: str) -> str | None:
    if len(name) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(name):
        return None
    return f"{name!r} is not a node name: a DNS subdomain of at most 253 lower-case letters, digits, '-' and '.'"


def _values_count_problem(operator: str, values: list[str]) -> str | None:
    if operator in ("In", "NotIn") and not values:
        return "must be given when operator is In or NotIn"
    if operator in ("Exists", "DoesNotExist") and values:
        return "must be empty when operator is Exists or DoesNotExist"
    if operator in ("Gt", "Lt") and len(values) != 1:
        return "must be exactly one value when operator is Gt or Lt"
    return None


def _requirement(value: Any, path: str, out: _Problems, operators: tuple[str, ...]) -> None:
    """A matchExpressions entry of a node selector term (`operators` NODE_OPERATORS) or a label selector."""
    req = _object(value, path, out)
    operator = _string(req.get("operator"), f"{path}.operator", out)
    values = _strings(req.get("values"), f"{path}.values", out)
    if operator not in operators:
        out.add(f"{path}.operator", f"{operator!r} is not one of {', '.join(operators)}")
    elif problem := _values_count_problem(operator, values):
        out.add(f"{path}.values", problem)
    _key(_string(req.get("key"), f"{path}.key", out), f"{path}.key", out)


def _field_requirement(value: Any, path: str, out: _Problems) -> None:
    """A matchFields entry: the node's name, In or NotIn exactly one value."""
    req = _object(value, path, out)
    operator = _string(req.get("operator"), f"{path}.operator", out)
    values = _strings(req.get("values"), f"{path}.values", out)
    if operator not in ("In", "NotIn"):
        out.add(f"{path}.operator", f"{operator!r} is not In or NotIn (the only operators of a node field)")
    elif len(values) != 1:
        out.add(f"{path}.values", "must be exactly one value for a node field")
    key = _string(req.get("key"), f"{path}.key", out)
    if key != NODE_NAME_FIELD:
        out.add(f"{path}.key", f"{key!r} is not a node field a selector may name ({NODE_NAME_FIELD})")
        return
    for i, name in enumerate(values):
        if problem := _node_name_problem(name):
            out.add(f"{path}.values[{i}]", problem)


def _node_selector_term(value: Any, path: str, out: _Problems) -> None:
    term = _object(value, path, out)
    for i, req in enumerate(_list(term.get("matchExpressions"), f"{path}.matchExpressions", out)):
        _requirement(req, f"{path}.matchExpressions[{i}]", out, NODE_OPERATORS)
    for i, req in enumerate(_list(term.get("matchFields"), f"{path}.matchFields", out)):
        _field_requirement(req, f"{path}.matchFields[{i}]", out)


def _weighted(value: Any, path: str, out: _Problems, term_field: str,
              check_term: Callable[[Any, str, _Problems], None]) -> None:
    """A preferred term: a weight of 1 to 100 and the term under `term_field`."""
    entry = _object(value, path, out)
    weight = _int32(entry.get("weight"), f"{path}.weight", out)
    if weight is not None and not 1 <= weight <= 100:
        out.add(f"{path}.weight", f"{weight} is not in the range 1-100")
    check_term(entry.get(term_field), f"{path}.{term_field}", out)


def _node_affinity(value: Any, path: str, out: _Problems) -> None:
    affinity = _object(value, path, out)
    required_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    if affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        required = _object(affinity["requiredDuringSchedulingIgnoredDuringExecution"], required_path, out)
        terms = required.get("nodeSelectorTerms")
        if not terms:  # absent, null or []: a required affinity that no node could meet
            out.add(f"{required_path}.nodeSelectorTerms", "must have at least one node selector term")
        for i, term in enumerate(_list(terms, f"{required_path}.nodeSelectorTerms", out)):
            _node_selector_term(term, f"{required_path}.nodeSelectorTerms[{i}]", out)
    preferred_path = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, entry in enumerate(_list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), preferred_path,
                                    out)):
        _weighted(entry, f"{preferred_path}[{i}]", out, "preference", _node_selector_term)


def label_selector_problems(value: Any, path: str) -> list[str]:
    """What the apiserver refuses in a metav1.LabelSelector at `path` (matchLabels and matchExpressions)."""
    out = _Problems()
    selector = _object(value, path, out)
    match_labels = _object(selector.get("matchLabels"), f"{path}.matchLabels", out)
    if all(isinstance(v, str) for v in match_labels.values()):
        out.extend(label_problems(f"{path}.matchLabels", match_labels))
    else:
        out.add(f"{path}.matchLabels", "every value must be a string")
    for i, req in enumerate(_list(selector.get("matchExpressions"), f"{path}.matchExpressions", out)):
        _requirement(req, f"{path}.matchExpressions[{i}]", out, SELECTOR_OPERATORS)
    return out


def _pod_affinity_term(value: Any, path: str, out: _Problems) -> None:
    term = _object(value, path, out)
    out.extend(label_selector_problems(term.get("labelSelector"), f"{path}.labelSelector"))
    for i, namespace in enumerate(_strings(term.get("namespaces"), f"{path}.namespaces", out)):
        if problem := _namespace_problem(namespace):
            out.add(f"{path}.namespaces[{i}]", problem)
    topology_key = _string(term.get("topologyKey"), f"{path}.topologyKey", out)
    if not topology_key:
        out.add(f"{path}.topologyKey", "must be given (a node label key, e.g. kubernetes.io/hostname)")
    else:
        _key(topology_key, f"{path}.topologyKey", out)


def _pod_affinity(value: Any, path: str, out: _Problems) -> None:
    affinity = _object(value, path, out)
    required_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, term in enumerate(_list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), required_path,
                                   out)):
        _pod_affinity_term(term, f"{required_path}[{i}]", out)
    preferred_path = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, entry in enumerate(_list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), preferred_path,
                                    out)):
        _weighted(entry, f"{preferred_path}[{i}]", out, "podAffinityTerm", _pod_affinity_term)


def affinity_problems(affinity: Any, path: str = "spec.pod.affinity") -> list[str]:
    """What the apiserver would refuse in a pod's core/v1 Affinity, one message per problem naming its field."""
    out = _Problems()
    parts = _object(affinity, path, out)
    _node_affinity(parts.get("nodeAffinity"), f"{path}.nodeAffinity", out)
    _pod_affinity(parts.get("podAffinity"), f"{path}.podAffinity", out)
    _pod_affinity(parts.get("podAntiAffinity"), f"{path}.podAntiAffinity", out)
    return out


def topology_spread_problems(constraints: list[Any],
                             path: str = "spec.pod.topologySpreadConstraints") -> list[str]:
    """What the apiserver would refuse in a pod's topologySpreadConstraints: maxSkew at least 1, a topologyKey,
    whenUnsatisfiable DoNotSchedule or ScheduleAnyway, and no {topologyKey, whenUnsatisfiable} pair twice."""
    out = _Problems()
    seen: set[tuple[str, str]] = set()
    for i, value in enumerate(constraints):
        where = f"{path}[{i}]"
        constraint = _object(value, where, out)
        skew = _int32(constraint.get("maxSkew"), f"{where}.maxSkew", out)
        if skew is not None and skew < 1:
            out.add(f"{where}.maxSkew", f"{skew} must be at least 1")
        key = _string(constraint.get("topologyKey"), f"{where}.topologyKey", out)
        if not key:
            out.add(f"{where}.topologyKey", "must be given (a node label key, e.g. topology.kubernetes.io/zone)")
        when = _string(constraint.get("whenUnsatisfiable"), f"{where}.whenUnsatisfiable", out)
        if when not in WHEN_UNSATISFIABLE:
            out.add(f"{where}.whenUnsatisfiable", f"{when!r} is not one of {', '.join(WHEN_UNSATISFIABLE)}")
        _object(constraint.get("labelSelector"), f"{where}.labelSelector", out)
        if (key, when) in seen:
            out.add(where, f"{{{key}, {when}}} is given twice: one constraint per topologyKey and whenUnsatisfiable")
        seen.add((key, when))
    return out


def toleration_problems(tolerations: list[Toleration], path: str = "spec.resources.tolerations") -> list[str]:
    """What the apiserver would refuse in the extra tolerations (the schema has checked operator and effect)."""
    out = _Problems()
    for i, t in enumerate(tolerations):
        where = f"{path}[{i}]"
        if t.key:
            _key(t.key, f"{where}.key", out)
        elif t.operator != "Exists":
            out.add(f"{where}.operator", "must be Exists when key is empty (which tolerates every taint)")
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            out.add(f"{where}.effect", "must be NoExecute when tolerationSeconds is set")
        if t.operator == "Exists" and t.value:
            out.add(f"{where}.value", "must be empty when operator is Exists")
        elif t.operator != "Exists" and (problem := label_value_problem(t.value or "")):
            out.add(f"{where}.value", f"{t.value!r} is not a valid label value: {problem}")
    return out

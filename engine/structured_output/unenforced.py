"""JSON-schema keywords that xgrammar compiles away, found before a schema is compiled.

xgrammar (0.2.9) turns a schema into a grammar and drops some keywords without a word: the grammar
then admits outputs that break the schema. vLLM refuses such a schema when `xgrammar` is the backend
asked for, and with `auto` falls back to another backend; Flotilla has xgrammar only, so both refuse it
with a 400 that names the keyword and where it stands. Each rule below was checked on xgrammar's EBNF
output (the grammar is the same with and without the keyword); tests/engine/structured_output/
test_unenforced_keywords.py checks that again against the installed xgrammar.

What is not refused: keywords that cannot apply to the schema's `type`, no-ops (`uniqueItems: false`),
annotations, and a `format` xgrammar does not know (JSON Schema calls `format` an annotation: a
validator does not check it unless asked, and xgrammar then allows any string).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# String formats xgrammar 0.2.9 turns into a grammar (others: any string).
ENFORCED_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
# Keywords that constrain a value (JSON Schema 2020-12's applicators and validation, and draft 7's
# `dependencies`/`additionalItems`): dropped beside `$ref`, `anyOf`, `oneOf` and `allOf`. Annotations
# and unknown keywords there lose nothing.
_ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "dependencies",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "items", "prefixItems",
    "additionalItems", "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "dependentSchemas", "$ref",
})
# Keywords xgrammar ignores wherever they stand, and the type of value they constrain (None: any).
_IGNORED = {"not": None, "if": None, "dependentRequired": "object", "dependentSchemas": "object",
            "dependencies": "object"}
_COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
# Where subschemas stand: one schema, a list of them, or a map of names to them.
_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else",
           "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


@dataclass(frozen=True)
class UnenforcedKeyword:
    """A keyword xgrammar would drop: which, where (a JSON pointer into the schema) and what it loses."""

    keyword: str
    pointer: str
    dropped: str

    def message(self) -> str:
        """The 400's text."""
        return (f"JSON schema keyword '{self.keyword}' at {self.pointer} is not enforced by the xgrammar "
                f"backend ({self.dropped}), so the output could break the schema; Flotilla has no other "
                f"structured-output backend to fall back to: remove the keyword and check it on the client")


def find_unenforced(schema: Any) -> UnenforcedKeyword | None:
    """The first keyword of `schema` (walked depth-first, without recursion) that xgrammar would drop."""
    stack = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        if not isinstance(node, dict):
            continue
        found = _dropped_here(node)
        if found is not None:
            return UnenforcedKeyword(found[0], pointer or "/", found[1])
        stack.extend(reversed(list(_subschemas(pointer, node))))
    return None


def _dropped_here(node: dict[str, Any]) -> tuple[str, str] | None:
    """(keyword, what is lost) for this schema object alone, or None."""
    types = _types(node)
    for keyword, kind in _IGNORED.items():
        if keyword in node and _applies(types, kind):
            return keyword, "any value passes it"
    if node.get("uniqueItems") is True and _applies(types, "array"):
        return "uniqueItems", "items may repeat"
    if "contains" in node and _applies(types, "array"):
        return "contains", "no item need match it"
    if "multipleOf" in node and _applies(types, "number"):
        return "multipleOf", "enforced on integers only"
    if "propertyNames" in node and "properties" in node and _applies(types, "object"):
        return "propertyNames", "dropped beside properties"
    if ("pattern" in node or _enforced_format(node)) and _applies(types, "string"):
        for keyword in ("minLength", "maxLength"):
            if keyword in node:
                return keyword, "lengths are dropped beside a pattern or format"
    missing = _unlisted_required(node)
    if missing is not None and _applies(types, "object"):
        return "required", f"'{missing}' is not among properties, so the object may leave it out"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "allOf", "with more than one schema it allows any value"
    for combinator in _COMBINATORS:
        if combinator in node:
            beside = sorted(k for k in node if k in _ASSERTIONS and k != combinator
                            and (k != "format" or _enforced_format(node)))
            if beside:
                return beside[0], f"keywords beside '{combinator}' are dropped"
    return None


def _unlisted_required(node: dict[str, Any]) -> str | None:
    """The first `required` name that `properties` does not list (xgrammar enforces only listed ones, whatever
    additionalProperties or patternProperties allow), or None; malformed forms are xgrammar's to judge."""
    required, listed = node.get("required"), node.get("properties", {})
    if not isinstance(required, list) or not isinstance(listed, dict):
        return None
    return next((name for name in required if isinstance(name, str) and name not in listed), None)


def _enforced_format(node: dict[str, Any]) -> bool:
    kind = node.get("format")
    return isinstance(kind, str) and kind in ENFORCED_FORMATS


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _applies(types: set[str], kind: str | None) -> bool:
    """Whether a keyword about values of `kind` (None: any) can constrain a schema of these types
    (no `type`: any value; `number` covers integers, which is why multipleOf asks for it alone)."""
    return kind is None or not types or kind in types


def _subschemas(pointer: str, node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key in _SCHEMA:
        if isinstance(node.get(key), dict):
            yield f"{pointer}/{key}", node[key]
    for key in _SCHEMA_LIST:
        if isinstance(node.get(key), list):
            yield from ((f"{pointer}/{key}/{i}", sub) for i, sub in enumerate(node[key]))
    for key in _SCHEMA_MAP:
        if isinstance(node.get(key), dict):
            yield from ((f"{pointer}/{key}/{_escape(name)}", sub) for name, sub in node[key].items())


def _escape(name: str) -> str:
    """A JSON pointer's token (RFC 6901)."""
    return str(name).replace("~", "~0").replace("/", "~1")

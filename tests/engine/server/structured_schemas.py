"""Twenty JSON schemas for the structured-output API tests: nested objects, arrays, enums, anyOf,
string patterns and required fields.

They are bounded as production schemas are: every string has a `maxLength`, a `pattern` of fixed
width or an `enum`; every number and integer a `minimum` and `maximum`; every array a `maxItems`.
xgrammar enforces all of these (docs/structured-output.md), so with compact JSON (no free
whitespace) each schema admits finitely many outputs and the longest of them is well under the
tests' `max_tokens`: an output cannot be cut short, it can only close. `unbounded_keywords` checks that.
"""

from __future__ import annotations

import re
from typing import Any

NAME = {"type": "string", "maxLength": 12}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("person", {"type": "object", "required": ["name", "age"],
                "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}}}),
    ("city", {"type": "object", "properties": {"city": NAME, "country": NAME}, "required": ["city", "country"]}),
    ("flag", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
    ("color_enum", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                    "required": ["color"]}),
    ("sizes_array", {"type": "object", "properties": {
        "sizes": {"type": "array", "items": {"enum": ["S", "M", "L"]}, "minItems": 1, "maxItems": 3}},
        "required": ["sizes"]}),
    ("nested", {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": NAME, "admin": {"type": "boolean"}},
                 "required": ["name", "admin"]}}, "required": ["user"]}),
    ("zip_pattern", {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                     "required": ["zip"]}),
    ("date_pattern", {"type": "object", "properties": {
        "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}, "required": ["date"]}),
    ("any_of", {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "boolean"}]}}, "required": ["value"]}),
    ("price", {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 10000}},
               "required": ["price"]}),
    ("test_scores_out_of_100", {"type": "object", "properties": {
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "maxItems": 4}},
        "required": ["scores"]}),
    ("top_array", {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3}),
    ("top_enum", {"enum": ["alpha", "beta", "gamma"]}),
    ("optional_field", {"type": "object", "properties": {"title": NAME, "note": NAME}, "required": ["title"]}),
    ("objects_array", {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "label": NAME},
        "required": ["id", "label"]}}}, "required": ["items"]}),
    ("status_any_of", {"anyOf": [
        {"type": "object", "properties": {"status": {"enum": ["ok"]}}, "required": ["status"]},
        {"type": "object", "properties": {"error": NAME}, "required": ["error"]}]}),
    ("code_pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                      "required": ["code"]}),
    ("deep", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"enum": [1, 2, 3]}}, "required": ["c"]}}, "required": ["b"]}},
        "required": ["a"]}),
    ("null_or_int", {"type": "object", "properties": {"count": {"type": ["integer", "null"], "minimum": 0,
                                                                "maximum": 1000}},
                     "required": ["count"]}),
    ("mixed", {"type": "object", "properties": {
        "name": NAME, "tags": {"type": "array", "items": NAME, "maxItems": 2},
        "level": {"enum": ["low", "high"]}, "active": {"type": "boolean"}},
        "required": ["name", "tags", "level", "active"]}),
]


def unbounded_keywords(schema: dict[str, Any], where: str = "$") -> list[str]:
    """Where `schema` lets an output grow without end: a string without maxLength, enum or a
    fixed-width pattern, a number or integer without minimum and maximum, an array without maxItems."""
    found: list[str] = []
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "enum" not in schema and "const" not in schema:
        pattern = schema.get("pattern")
        if "string" in types and "maxLength" not in schema and not (pattern and _fixed_width(pattern)):
            found.append(f"{where}: string")
        if types & {"integer", "number"} and not {"minimum", "maximum"} <= schema.keys():
            found.append(f"{where}: number")
        if "array" in types and "maxItems" not in schema:
            found.append(f"{where}: array")
    for key, sub in (schema.get("properties") or {}).items():
        found += unbounded_keywords(sub, f"{where}.{key}")
    if isinstance(schema.get("items"), dict):
        found += unbounded_keywords(schema["items"], f"{where}[]")
    for i, sub in enumerate(schema.get("anyOf") or []):
        found += unbounded_keywords(sub, f"{where}|{i}")
    return found


def _fixed_width(pattern: str) -> bool:
    """Whether a regex matches strings of at most a bounded length (no *, + or open {n,})."""
    return re.search(r"(?<!\\)[*+]|\{\d*,\}", pattern) is None

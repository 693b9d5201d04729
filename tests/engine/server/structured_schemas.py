"""Twenty JSON schemas for the structured-output API tests: nested objects, arrays, enums, anyOf,
string patterns and required fields. Strings and arrays are bounded so a small model must close them."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "maxLength": 12}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("person", {"type": "object", "properties": {"name": NAME, "age": {"type": "integer"}},
                "required": ["name", "age"]}),
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
    ("any_of", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}},
                "required": ["value"]}),
    ("number", {"type": "object", "properties": {"price": {"type": "number"}}, "required": ["price"]}),
    ("test_scores_out_of_100", {"type": "object", "properties": {
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "maxItems": 4}},
        "required": ["scores"]}),
    ("top_array", {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3}),
    ("top_enum", {"enum": ["alpha", "beta", "gamma"]}),
    ("optional_field", {"type": "object", "properties": {"title": NAME, "note": NAME}, "required": ["title"]}),
    ("objects_array", {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "label": NAME}, "required": ["id", "label"]}}},
        "required": ["items"]}),
    ("status_any_of", {"anyOf": [
        {"type": "object", "properties": {"status": {"enum": ["ok"]}}, "required": ["status"]},
        {"type": "object", "properties": {"error": NAME}, "required": ["error"]}]}),
    ("code_pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                      "required": ["code"]}),
    ("deep", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"enum": [1, 2, 3]}}, "required": ["c"]}}, "required": ["b"]}},
        "required": ["a"]}),
    ("null_or_int", {"type": "object", "properties": {"count": {"type": ["integer", "null"]}},
                     "required": ["count"]}),
    ("mixed", {"type": "object", "properties": {
        "name": NAME, "tags": {"type": "array", "items": NAME, "maxItems": 2},
        "level": {"enum": ["low", "high"]}, "active": {"type": "boolean"}},
        "required": ["name", "tags", "level", "active"]}),
]

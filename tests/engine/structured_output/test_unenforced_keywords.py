"""engine/structured_output/unenforced.py: which JSON-schema keywords are refused because xgrammar drops
them, checked against the installed xgrammar (a keyword is refused only where its grammar is the grammar
without it; an upgrade that starts enforcing one fails here and the refusal can go)."""

from __future__ import annotations

import json

import pytest

from flotilla.engine.structured_output.unenforced import find_unenforced

xgr = pytest.importorskip("xgrammar")

INT = {"type": "integer", "minimum": 0, "maximum": 9}
OBJ_AB = {"type": "object", "properties": {"a": INT, "b": INT}}
TAGS = {"type": "array", "items": INT, "maxItems": 3}

# (schema, refused keyword, where, the schema xgrammar compiles it to)
REFUSED = [
    ({**TAGS, "uniqueItems": True}, "uniqueItems", "/", TAGS),
    ({**TAGS, "contains": {"const": 1}}, "contains", "/", TAGS),
    ({"type": "number", "minimum": 0, "maximum": 9, "multipleOf": 0.5}, "multipleOf", "/",
     {"type": "number", "minimum": 0, "maximum": 9}),
    ({**INT, "not": {"const": 3}}, "not", "/", INT),
    ({**OBJ_AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if", "/", OBJ_AB),
    ({**OBJ_AB, "dependentRequired": {"a": ["b"]}}, "dependentRequired", "/", OBJ_AB),
    ({**OBJ_AB, "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas", "/", OBJ_AB),
    ({**OBJ_AB, "dependencies": {"a": ["b"]}}, "dependencies", "/", OBJ_AB),  # draft 7's spelling
    ({**OBJ_AB, "propertyNames": {"maxLength": 0}}, "propertyNames", "/", OBJ_AB),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, "maxLength", "/",
     {"type": "string", "pattern": "[a-z]+"}),
    ({"type": "string", "format": "email", "minLength": 9}, "minLength", "/", {"type": "string", "format": "email"}),
    ({"type": "object", "allOf": [OBJ_AB, {"required": ["a"]}]}, "allOf", "/", {"allOf": [{}, {}]}),  # any value
    ({"$defs": {"d": INT}, "$ref": "#/$defs/d", "maximum": 3}, "maximum", "/",
     {"$defs": {"d": INT}, "$ref": "#/$defs/d"}),
    ({**INT, "anyOf": [{"minimum": 5}, {"maximum": 1}]}, "maximum", "/", {"anyOf": [{"minimum": 5}, {"maximum": 1}]}),
    ({"type": "integer", "oneOf": [{"type": "integer"}, {"type": "string"}]}, "type", "/",
     {"oneOf": [{"type": "integer"}, {"type": "string"}]}),
    # A required name that `properties` does not list: the grammar lets the object leave it out, with additional
    # properties off (strict), allowed or typed, and where a patternProperties key matches it. Alone, it makes `{}`
    # the only object (found by fuzzing the server: {"type": "object", "required": ["a"]} gave `{}`).
    ({"type": "object", "required": ["a"]}, "required", "/", {"type": "object", "additionalProperties": False}),
    ({**OBJ_AB, "required": ["a", "c"]}, "required", "/", {**OBJ_AB, "required": ["a"]}),
    ({"type": "object", "additionalProperties": INT, "required": ["c"]}, "required", "/",
     {"type": "object", "additionalProperties": INT}),
    ({"type": "object", "patternProperties": {"^c": INT}, "required": ["c"]}, "required", "/",
     {"type": "object", "patternProperties": {"^c": INT}}),
]


def _grammar(schema: dict) -> str:
    return str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True))


@pytest.mark.parametrize("schema, keyword, pointer, compiled_as", REFUSED, ids=[c[1] for c in REFUSED])
def test_a_keyword_xgrammar_drops_is_refused_by_name(schema, keyword, pointer, compiled_as):
    assert _grammar(schema) == _grammar(compiled_as)  # what the refusal stands on
    found = find_unenforced(schema)
    assert found is not None and (found.keyword, found.pointer) == (keyword, pointer)
    assert f"'{keyword}' at {pointer}" in found.message()


def test_the_keyword_is_found_where_it_stands_and_named_by_its_pointer():
    schema = {"type": "object", "properties": {"a/b": {"type": "array", "items": {
        "type": "object", "properties": {"tags": {**TAGS, "uniqueItems": True}}}}}}
    found = find_unenforced({"$defs": {"x": INT}, "anyOf": [{"type": "null"}, schema]})
    assert found is not None and found.pointer == "/anyOf/1/properties/a~1b/items/properties/tags"


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"not": INT, "contains": INT, "if": INT, "allOf": INT}},  # names, not keywords
    {**TAGS, "uniqueItems": False},
    {"type": "integer", "minimum": 0, "maximum": 20, "multipleOf": 5},  # enforced on integers
    {"type": "integer", "maxLength": 3, "uniqueItems": True},  # cannot apply to an integer
    {"type": "string", "maxLength": 3}, {"type": "string", "pattern": "[a-z]+"},
    {"type": "string", "format": "password", "maxLength": 8},  # an unknown format: an annotation
    {"type": "object", "additionalProperties": INT, "propertyNames": {"maxLength": 3}},
    {"$defs": {"d": INT}, "$ref": "#/$defs/d", "description": "d", "title": "t", "default": 1},
    {"anyOf": [INT, {"type": "null"}], "default": None, "title": "pydantic's Optional[int]"},
    {"allOf": [INT]}, {"enum": [{"not": 1}, {"uniqueItems": True}]}, {"const": {"if": 1}},
    {**OBJ_AB, "required": ["b", "a"]}, {"type": "string", "required": ["c"]},  # listed; cannot apply
    {"type": "string", "format": ["odd"], "maxLength": 3, "properties": []},  # malformed: xgrammar's to judge
], ids=str)
def test_what_xgrammar_enforces_or_cannot_apply_is_accepted(schema):
    assert find_unenforced(schema) is None

"""Structural tags: text that runs free or follows other formats, with JSON schemas (and more) inside tags.

vLLM takes a structural tag as `response_format: {"type": "structural_tag", ...}` or as
`structured_outputs.structural_tag` (its JSON text) and hands it to xgrammar in one of two forms:
- the older one, `{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}`: the output runs free
  until it writes a trigger, which must go on as one of the structures' `begin` strings; then the structure's
  JSON schema, its `end`, and free text again (xgrammar's deprecated `StructuralTagItem` list);
- the newer one, `{"format": {...}}`, xgrammar's format tree (`tag`, `triggered_tags`, `sequence`, `or`,
  `json_schema`, `regex`, `grammar`, `const_string`, `any_text`, ...).

`format_text` turns either into the newer form's JSON text, the one xgrammar path here: the older form is the
newer one's `triggered_tags` with a `tag` per structure (xgrammar builds the same grammar from both, checked on
its EBNF output). Every JSON schema the tag holds is checked for keywords xgrammar would drop (unenforced.py),
as a request's own schema is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flotilla.engine.structured_output.unenforced import find_unenforced

# Format types whose `json_schema` is compiled as a JSON schema (qwen_xml_parameter: its deprecated XML spelling).
_SCHEMA_FORMATS = ("json_schema", "qwen_xml_parameter")


def format_text(text: str) -> str:
    """The structural tag `text` (either form) as the newer form's JSON text; ValueError says what is wrong."""
    try:
        return _format_text(text)
    except RecursionError:  # JSON nested past Python's stack (xgrammar itself refuses formats past 100 levels)
        raise ValueError("the structural tag is nested too deeply") from None


def _format_text(text: str) -> str:
    try:
        tag = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the structural tag is not JSON: {exc}") from None
    if not isinstance(tag, dict):
        raise ValueError("the structural tag must be a JSON object")
    if "structures" in tag:
        converted = _from_structures(tag)
        schemas = [(f"/structures/{i}/schema", s["schema"]) for i, s in enumerate(tag["structures"])]
        tag = converted
    else:
        schemas = list(_schemas(tag, ""))
    for pointer, schema in schemas:
        if not isinstance(schema, dict):  # `true`: any JSON value
            continue
        unenforced = find_unenforced(schema)
        if unenforced is not None:
            raise ValueError(f"in the structural tag's schema at {pointer}: {unenforced.message()}")
    return json.dumps(tag)


def _from_structures(tag: dict[str, Any]) -> dict[str, Any]:
    """The older form (`structures` and `triggers`) as the newer one's `triggered_tags`."""
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise ValueError("the structural tag's structures must be a non-empty list of {begin, schema, end}")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("the structural tag's triggers must be a list of non-empty strings")
    tags = []
    for i, item in enumerate(structures):
        if not isinstance(item, dict) or not isinstance(item.get("schema"), dict | bool):
            raise ValueError(f"the structural tag's structures[{i}] must be an object with begin, schema (a JSON "
                             "schema) and end")
        tags.append({"type": "tag", "begin": item.get("begin"),
                     "content": {"type": "json_schema", "json_schema": item["schema"]}, "end": item.get("end")})
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}


def _schemas(node: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON schema (an object) a format tree holds, with its JSON pointer in the tag."""
    if isinstance(node, dict):
        if node.get("type") in _SCHEMA_FORMATS and isinstance(node.get("json_schema"), dict):
            yield f"{pointer}/json_schema", node["json_schema"]
            return
        for key, value in node.items():
            yield from _schemas(value, f"{pointer}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _schemas(value, f"{pointer}/{i}")

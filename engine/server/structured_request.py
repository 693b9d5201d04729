"""A request's structured-output fields -> StructuredOutputsParams.

Three spellings reach the same constraint, as in vLLM: OpenAI's `response_format` (`json_object`,
`json_schema`, and vLLM's `structural_tag`), vLLM's `structured_outputs` object, and its older `guided_json` /
`guided_regex` / `guided_choice` / `guided_grammar` fields. A request may use one of them; an unknown type, a
malformed object or two constraints at once is a 400 that names the field.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from flotilla.engine.server.errors import APIError
from flotilla.engine.structured_output.params import StructuredOutputsParams
from flotilla.validation_messages import describe

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs(req: Any) -> StructuredOutputsParams | None:
    """The request's one output constraint, or None when it asks for free text."""
    found: list[tuple[str, dict[str, Any]]] = []
    response_format = getattr(req, "response_format", None)
    if response_format is not None:
        spec = _from_response_format(response_format)
        if spec is not None:
            found.append(("response_format", spec))
    extras = getattr(req, "structured_outputs", None)
    if extras is not None:
        found.append(("structured_outputs", dict(extras)))
    for field, kind in _GUIDED.items():
        value = getattr(req, field, None)
        if value is not None:
            found.append((field, {kind: value}))
    if not found:
        return None
    if len(found) > 1:
        raise APIError(400, "give one output constraint, not several: " + ", ".join(name for name, _ in found),
                       param=found[1][0])
    field, spec = found[0]
    try:
        return StructuredOutputsParams(**spec)
    except ValidationError as exc:
        where = lambda loc: ".".join([field, *(str(x) for x in loc)])  # noqa: E731
        raise APIError(400, "; ".join(describe(exc.errors(), where)), param=field) from None
    except TypeError as exc:
        raise APIError(400, f"{field}: {exc}", param=field) from None


def _from_response_format(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's response_format: text (free), json_object, or json_schema with its `schema`; or vLLM's
    structural_tag, the whole object (either form, `structures` + `triggers` or `format`) as the tag's JSON
    text, as vLLM passes it on (structured_output/structural_tag.py reads it)."""
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        wrapper = response_format.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format json_schema needs json_schema.schema, a JSON schema object",
                           param="response_format")
        return {"json": schema}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps(response_format)}
    raise APIError(400, f"response_format type {kind!r} is not one of text, json_object, json_schema, "
                   "structural_tag", param="response_format")

"""What a request's output must match: vLLM's `StructuredOutputsParams`, one constraint per request."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

if TYPE_CHECKING:
    from flotilla.engine.sampling_params import SamplingParams

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsParams(BaseModel):
    """Exactly one of: `json` (a JSON schema, as a dict or its text), `regex`, `choice` (the output is one
    of these strings), `grammar` (EBNF, xgrammar's dialect of GBNF), `json_object` (any JSON object),
    `structural_tag` (xgrammar's structural tag, as JSON text as vLLM takes it, or a dict: structural_tag.py).

    `disable_any_whitespace` keeps JSON compact (no free whitespace between tokens), which spares small
    models from looping on whitespace. Objects admit only the properties their schema names (xgrammar's
    strict mode, as vLLM).
    """

    # vLLM's name for the schema is `json`, which pydantic reserves for a method: an alias.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    # cache_key(), once made: it crosses the pipe to the engine core with the params (pydantic pickles private
    # attributes), so that a front end that made it off its event loop spares the step loop the work.
    _key: tuple[str, str, bool] | None = PrivateAttr(None)
    # Whether the schema was checked for keywords the grammar would not enforce (`find_unenforced`) and what was
    # found (its message, or None): set by `ready_off_the_loop` with the front end's dict, so that the core, given
    # the schema as text, need not parse the text again to check it (a C call holding its GIL: 0.15 s at 7.5 MB).
    _checked: bool = PrivateAttr(False)
    _unenforced: str | None = PrivateAttr(None)

    @field_validator("structural_tag", mode="before")
    @classmethod
    def _tag_as_text(cls, value: Any) -> Any:
        """A structural tag given as an object (the Python API, or a request's `structured_outputs`) as its JSON
        text, the form vLLM's field takes."""
        return json.dumps(value) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsParams:
        given = [k for k in _KINDS if self._value(k) not in (None, False)]
        if len(given) != 1:
            named = ", ".join(given) if given else "none"
            raise ValueError(f"structured outputs take exactly one of json, regex, choice, grammar, json_object, "
                             f"structural_tag (given: {named})")
        if self.choice is not None and not self.choice:
            raise ValueError("structured outputs: choice must list at least one string")
        return self

    def _value(self, kind: str) -> Any:
        return self.json_schema if kind == "json" else getattr(self, kind)

    @property
    def kind(self) -> str:
        """Which constraint this is: json, regex, choice, grammar, json_object or structural_tag."""
        return next(k for k in _KINDS if self._value(k) not in (None, False))

    def cache_key(self) -> tuple[str, str, bool]:
        """Equal for requests that compile to the same grammar: a schema's key order does not matter, except the
        order of its `properties`, in which the grammar emits them. Made once (a 7.5 MB schema took 0.5 s):
        `key_made_off_the_loop` makes it on a worker thread before the request goes to the engine."""
        if self._key is None:
            value = self._value(self.kind)
            text = value if isinstance(value, str) else json.dumps(_canonical(value))
            self._key = (self.kind, text, self.disable_any_whitespace)
        return self._key


async def key_made_off_the_loop(params: StructuredOutputsParams | None) -> None:
    """Make a schema's `cache_key()` on a worker thread (a no-op for other constraints, whose key is their text):
    the step loop, which needs it at admission, then finds it made, and so does the front end's event loop."""
    if params is not None and params._key is None and isinstance(params.json_schema, dict):
        import asyncio

        await asyncio.to_thread(params.cache_key)


async def ready_off_the_loop(params: SamplingParams) -> SamplingParams:
    """`params` to send to the engine core: a dict schema replaced by its key's text, checked for unenforced
    keywords, all on a worker thread. Pickling the dict across the core pipe (and the key's text beside it) and
    unpickling it in the core held each process's GIL (~0.1 s each at 7.5 MB: the core's step loop stopped); a
    string crosses in a millisecond, and xgrammar compiles from the text. The front end keeps its own params."""
    so = params.structured_outputs
    if so is None or not isinstance(so.json_schema, dict):
        return params
    import asyncio

    return params.model_copy(update={"structured_outputs": await asyncio.to_thread(_as_text, so)})


def _as_text(so: StructuredOutputsParams) -> StructuredOutputsParams:
    from flotilla.engine.structured_output.unenforced import find_unenforced

    key = so.cache_key()
    text = so.model_copy(update={"json_schema": key[1]})
    text._key = key
    try:
        unenforced = find_unenforced(so.json_schema)
    except Exception:  # an odd schema's failure is the core's to report, as a compile error (a 400), not a 500 here
        return text
    text._checked = True
    text._unenforced = unenforced.message() if unenforced is not None else None
    return text


def _canonical(value: Any, properties: bool = False) -> Any:
    """`value` with every object's keys sorted, but for a `properties` map's (`properties`: this is one)."""
    if isinstance(value, dict):
        items = value.items() if properties else sorted(value.items())
        return {k: _canonical(v, not properties and k == "properties") for k, v in items}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value

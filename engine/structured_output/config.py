"""`--structured-outputs-config`: the server-wide structured-output settings, with vLLM's JSON keys."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from flotilla.engine.json_flag import parse_json_flag

ReasoningParserName = Literal["deepseek_r1", "qwen3"]


class StructuredOutputsConfig(BaseModel):
    """Structured output for every request, as `vllm serve --structured-outputs-config` takes it.

    `backend` is "auto" or "xgrammar" (the one backend here). `disable_any_whitespace` compiles every
    JSON schema, `json_object` and tool-call grammar without free whitespace (compact JSON), as if each
    request had set `structured_outputs.disable_any_whitespace`; the default, as vLLM's, lets whitespace
    run free between JSON tokens, which small models can fall into until max_tokens.

    `compile_timeout_s` (Flotilla's own key; vLLM has none for whole grammars) bounds a grammar's compile,
    which runs off the step loop in a compile process (parse, compile and the grammar's serialization): a
    compile that has run that long is killed and fails its requests with a 400 (and its constraint is refused
    at once from then on). See structured_output/compile_queue.py.

    `warm_up` (Flotilla's own key) starts the compiler and its compile processes in the background as soon as
    the server's engine is ready, so that the first constrained request does not wait for their start (a fork
    server importing xgrammar and torch: seconds). False starts them on the first constrained request instead,
    as the offline LLM does: a server that never constrains output saves their ~230 MiB and ~2-3 s of CPU at
    start (structured_output/waiting_room.py).

    `reasoning_parser` (vLLM's key; the server's `--reasoning-parser` sets it) makes a thinking request's grammar
    start after its `</think>`, so that the thinking runs free; `enable_in_reasoning` (vLLM's key) applies the
    grammar from the first token all the same (structured_output/thinking.py).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["auto", "xgrammar"] = "auto"
    disable_any_whitespace: StrictBool = False
    compile_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    warm_up: StrictBool = True
    reasoning_parser: ReasoningParserName | None = None
    enable_in_reasoning: StrictBool = False


def parse_structured_outputs_config(value: str | dict[str, Any] | None) -> StructuredOutputsConfig:
    """The flag's value (JSON text, or a dict from the Python API) as a config; errors name the flag."""
    if value is None:
        return StructuredOutputsConfig()
    return parse_json_flag(value, "--structured-outputs-config", StructuredOutputsConfig)


def with_reasoning_parser(value: str | dict[str, Any] | None, name: str) -> dict[str, Any]:
    """The flag's value (as `parse_structured_outputs_config` takes it) with `reasoning_parser` set to `name`: vLLM's
    `LLM(reasoning_parser=...)` sets the same key as the server's `--reasoning-parser`. A ValueError names an unknown
    parser, or one that differs from the value's own `reasoning_parser`."""
    if name not in get_args(ReasoningParserName):
        raise ValueError(f"reasoning_parser {name!r} is not one of {', '.join(get_args(ReasoningParserName))}")
    config = parse_structured_outputs_config(value)
    if config.reasoning_parser not in (None, name):
        raise ValueError(f"reasoning_parser {name} and --structured-outputs-config's reasoning_parser "
                         f"{config.reasoning_parser} differ")
    return config.model_dump(exclude_unset=True) | {"reasoning_parser": name}

"""Flotilla's inference engine: `LLM` and `SamplingParams` for offline use, `flotilla serve` for HTTP.

The names below are imported on first use, so `import flotilla.engine.config` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]

_LOCATIONS = {
    "LLM": "flotilla.engine.llm",
    "LLMEngine": "flotilla.engine.llm_engine",
    "RequestOutput": "flotilla.engine.outputs",
    "SamplingParams": "flotilla.engine.sampling_params",
    "StructuredOutputsParams": "flotilla.engine.structured_output.params",
}


def __getattr__(name: str) -> Any:
    if name not in _LOCATIONS:
        raise AttributeError(f"module 'flotilla.engine' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LOCATIONS[name]), name)

"""A named call on the engine between steps (load or unload a LoRA adapter, embed or classify prompts), picklable so
that it can cross into the engine-core process: a lambda could run on the in-process engine thread only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the API process never imports the engine (nor torch): only the core runs the call
    from flotilla.engine.llm_engine import LLMEngine

# The engine methods a front end may call: the only ones the core process will run for it.
CALLABLE_METHODS = frozenset({"add_lora", "remove_lora", "embed", "classify", "token_classify", "sleep", "wake_up",
                              "is_sleeping", "sleep_pending", "reload_weights"})


@dataclass(frozen=True)
class EngineCall:
    """`engine.<method>(*args)`, named so that it can be sent to another process and checked there."""

    method: str
    args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in CALLABLE_METHODS:
            raise ValueError(f"{self.method!r} is not an engine call (one of {sorted(CALLABLE_METHODS)})")

    @property
    def changes_gauges(self) -> bool:
        """Whether the call changes what the metrics' gauges show (a sleep's state, the requests it aborted): its
        front end publishes a stats snapshot before the answer, so a scrape after the answer sees it."""
        return self.method in ("sleep", "wake_up")

    def __call__(self, engine: LLMEngine) -> Any:
        """Run it on `engine` (on the thread or in the process that owns the engine)."""
        return getattr(engine, self.method)(*self.args)

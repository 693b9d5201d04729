"""What the OpenAI server drives: the front-end interface of the engine, stated once.

Two classes satisfy it: `AsyncEngine` (the step loop on a thread of the server's process) and
`EngineCoreClient` (the step loop in an engine-core process of its own); `flotilla serve` picks one
(`VLLM_ENABLE_V1_MULTIPROCESSING`, engine/server/cli.py) and the routes see only this protocol.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flotilla.engine.engine_call import EngineCall
    from flotilla.engine.lora.request import LoRARequest
    from flotilla.engine.outputs import RequestOutput
    from flotilla.engine.sampling_params import SamplingParams


class ServingEngine(Protocol):
    """A running engine as a front end sees it: stream requests, run named calls between steps, stop.

    Errors: once the engine has died or is shutting down, `generate` and `call` raise `EngineDeadError`
    (engine/errors.py), and every open stream and pending call gets one.
    """

    @property
    def is_alive(self) -> bool:
        """True while the step loop runs and has not died of an error."""
        ...

    @property
    def num_unfinished(self) -> int:
        """Requests added and not yet finished or aborted."""
        ...

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[RequestOutput]:
        """Queue a request and yield its outputs as steps produce them; the last one is `finished`.
        Outputs are cumulative: a reader that falls behind gets the latest one, not every step's.

        Closing the iterator early (e.g. the client went away) aborts the request and frees its blocks.
        """
        ...

    async def call(self, call: EngineCall, /) -> Any:
        """Run `call` on the engine between steps (load or unload an adapter, embed prompts); returns its
        result or raises its error."""
        ...

    def abort(self, request_id: str) -> None:
        """Abort a request; callable from any thread."""
        ...

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step loop: in-flight requests are aborted and answered with `EngineDeadError`, and the engine
        gives its device memory back (`LLMEngine.shutdown`)."""
        ...

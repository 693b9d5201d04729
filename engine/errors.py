"""Errors the engine raises about one request, so a front end can answer that request alone; and the one
about the engine as a whole (`EngineDeadError`)."""

from __future__ import annotations


class InvalidParamError(ValueError):
    """A request field is out of range; `param` names it (the server answers 400 with that param)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type[InvalidParamError], tuple[str, str | None]]:
        # Pickled whole (the engine-core process sends it to the API process), param included.
        return type(self), (str(self), self.param)


class LoRAAdapterError(ValueError):
    """The adapter cannot be served: missing files, an unsupported PEFT feature, a rank or shape problem (here,
    not in lora/adapter.py, so that the API process can receive it from the engine core without torch)."""


class RequestFailedError(RuntimeError):
    """Processing one request failed; the engine aborted it (blocks freed) and served the others."""

    def __init__(self, request_id: str, cause: BaseException) -> None:
        super().__init__(f"request {request_id} failed: {cause!r}")
        self.request_id = request_id
        self.cause = cause

    def __reduce__(self) -> tuple[type[RequestFailedError], tuple[str, BaseException]]:
        # Pickled for the trip out of the engine-core process; the cause travels as its text (it may
        # not pickle), and the message stays the same.
        return type(self), (self.request_id, _CauseText(repr(self.cause)))


class _CauseText(RuntimeError):
    """A cause that crossed a process boundary as its `repr`, which it shows again unchanged."""

    def __repr__(self) -> str:
        return str(self)


class EngineBusyError(RuntimeError):
    """The engine cannot take this request now (e.g. too many grammars compiling); the server answers 503, and
    the same request may succeed later."""


class EngineDeadError(RuntimeError):
    """The step loop stopped after an unexpected error, or is shutting down: every waiter gets one (the server
    answers 503, and a server whose loop died exits to be restarted)."""


def client_error(failure: RequestFailedError) -> BaseException:
    """What a front end hands the caller for a request that failed after it was queued: a refusal found only
    then (an invalid parameter, e.g. a grammar that compiled too slowly or reached a dead end: a 400; or a busy
    engine: a 503) as itself (a stream already begun ends on it as an error event); any other failure as the
    failure (a 500)."""
    if isinstance(failure.cause, InvalidParamError | EngineBusyError):
        return failure.cause
    return failure

"""Errors the engine raises about one request, so a front end can answer that request alone."""

from __future__ import annotations


class InvalidParamError(ValueError):
    """A request field is out of range; `param` names it (the server answers 400 with that param)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestFailedError(RuntimeError):
    """Processing one request failed; the engine aborted it (blocks freed) and served the others."""

    def __init__(self, request_id: str, cause: BaseException) -> None:
        super().__init__(f"request {request_id} failed: {cause!r}")
        self.request_id = request_id
        self.cause = cause

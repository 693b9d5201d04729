"""OpenAI-shaped error responses, and the app's mapping of the errors routes raise to them."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from flotilla.engine.errors import EngineBusyError, EngineDeadError, InvalidParamError, RequestFailedError
from flotilla.validation_messages import describe

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error to return to the client as OpenAI's error JSON with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}`, which the openai SDK reads."""
    kind = _TYPES.get(status)
    if kind is None:
        try:
            kind = HTTPStatus(status).phrase.replace(" ", "") + "Error"
        except ValueError:  # e.g. 499, nginx's "client closed request"
            kind = "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """A JSONResponse carrying OpenAI's error body."""
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def add_error_handlers(app: FastAPI) -> None:
    """Answer the errors routes raise as OpenAI's error JSON: a bad body or parameter 400, a dead or busy
    engine 503, a request that failed in the engine 500, an `APIError` or HTTP error its own status."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, _describe_validation(exc), param=_first_param(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_response(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(EngineBusyError)
    async def engine_busy(_: Request, exc: EngineBusyError) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(InvalidParamError)
    async def invalid_param(_: Request, exc: InvalidParamError) -> JSONResponse:
        return error_response(400, str(exc), exc.param)

    @app.exception_handler(RequestFailedError)
    async def request_failed(_: Request, exc: RequestFailedError) -> JSONResponse:
        return error_response(500, str(exc))


def _errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """The validation errors, a JSON syntax error said in words: its location is a character position, not a
    parameter (FastAPI's loc ("body", 11) made the param "11")."""
    errors = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            position = err.get("loc", ("body", "?"))[-1]
            reason = (err.get("ctx") or {}).get("error", "")
            err = {**err, "loc": ("body",), "msg": f"the body is not valid JSON: {reason} (at character {position})"}
        errors.append(err)
    return errors


def _describe_validation(exc: RequestValidationError) -> str:
    where = lambda loc: ".".join(str(x) for x in loc if x != "body")  # noqa: E731
    return "invalid request: " + "; ".join(describe(_errors(exc), where))


def _first_param(exc: RequestValidationError) -> str | None:
    for err in _errors(exc):
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if loc:
            return loc[0]
    return None

"""OpenAI-shaped error responses."""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

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

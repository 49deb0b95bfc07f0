"""The HTTP API's one error shape and its statuses.

Every error answer is JSON ``{"error": "<what is wrong, naming the field or setting>"}``, with
``"field"`` when one field is at fault. This module turns each failure into that shape, the
framework's own included (FastAPI's validation errors, Starlette's 404 and 405, a body that is
not JSON, an unexpected exception):

- 400 (CONTRACT.md: "400 with {"error": ...} on bad input"): the body is unusable (not JSON,
  the message giving line and column; not a JSON object; absent; a number longer than Python
  parses, 4,300 digits), or a field's value is invalid (wrong type, two timing fields, a bad
  id, an unknown topic, a partition the topic lacks, a header name that only looks like
  kdelay's); the message starts with the field.
- 403: the topic is internal (``__kdelay*``, Kafka's own; proxy/routing/internal_topics.py).
- 404: no such route. 405: the route has no such method (the ``Allow`` header lists them).
- 413: too large: the body over ``max_request_bytes``, a record over one of the proxy's size
  limits (``max_value_bytes``, ...), or a record upstream Kafka refused as too large
  (MESSAGE_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE), naming the upstream setting to raise.
- 422: more headers than ``max_headers`` (a count limit; CONTRACT.md v2: 413 or 422 naming
  the limit).
- 502: upstream Kafka refused the record for good for another reason (authorization, policy).
- 503: upstream Kafka is unavailable for now (a retriable error, a timeout, no metadata); the
  answer carries ``Retry-After``. Only retriable conditions are 503.
- 500: a bug; logged with its traceback.

The body's limits (413, 408) are proxy/http/body.py's.

Runs on the proxy's asyncio loop, like the rest of the HTTP API.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import kafka.errors as kerr
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from kdelay import logs
from kdelay.buffer import BUFFER_TOPIC
from kdelay.errors import KdelayError
from kdelay.proxy.limits import Violation
from kdelay.proxy.metrics import ProxyMetrics

log = logs.get(__name__)

# ASGI's callables (the spec's types; Starlette's own are the same shapes).
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The statuses Starlette's router and FastAPI raise as HTTPException themselves.
_FRAMEWORK_STATUSES = (400, 404, 405, 413)
#: Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_S = 1
_SIZE_CODES = {
    int(kerr.MessageSizeTooLargeError.errno),
    int(kerr.RecordListTooLargeError.errno),
}


class Problem(BaseModel):
    """What was wrong with the request, naming the field or setting, or why the proxy cannot
    serve it now."""

    error: str
    field: str | None = None


class ApiError(KdelayError):
    """An error answer: ``status``, a message that names the culprit, and its ``field``."""

    status = 500

    def __init__(
        self, message: str, *, field: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        return problem(self.status, str(self), self.field, self.headers)


class BadRequestError(ApiError):
    """A field's value the caller must fix (400); the message starts with ``<field>:``."""

    status = 400

    def __init__(self, message: str) -> None:
        field, sep, _ = message.partition(":")
        super().__init__(message, field=field if sep and " " not in field else None)


class ForbiddenTopicError(ApiError):
    """The message is for an internal topic, which no client writes (403)."""

    status = 403


class OverLimitError(ApiError):
    """The message is over one of the proxy's limits; 413 for a size, 422 for a count."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(f"{violation.field}: {violation.describe()}", field=violation.field)
        self.violation = violation
        self.status = 413 if violation.is_size else 422


class UnavailableError(ApiError):
    """Upstream Kafka cannot take the request now; 503, retry later."""

    status = 503

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": str(RETRY_AFTER_S)})


class TooLargeUpstreamError(ApiError):
    """Upstream Kafka refused the record as too large: 413, naming what to raise."""

    status = 413


class RefusedUpstreamError(ApiError):
    """Upstream Kafka refused the record for good, not for its size: 502."""

    status = 502


def problem(
    status: int,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one error shape."""
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status, headers=dict(headers or {}) or None)


def upstream_refusal(code: int, detail: str) -> ApiError:
    """The answer for a record upstream Kafka did not take (Kafka error ``code``)."""
    error = kerr.for_code(code)
    name = str(getattr(error, "message", code))
    if code in _SIZE_CODES:
        return TooLargeUpstreamError(
            f"value: the record is too large for upstream Kafka ({name}: {detail}); make it "
            f"smaller, or raise max.message.bytes of topic {BUFFER_TOPIC} and message.max.bytes "
            "in the proxy's upstream_config",
            field="value",
        )
    if getattr(error, "retriable", False):
        return UnavailableError(f"upstream Kafka did not take the record ({name}): {detail}")
    return RefusedUpstreamError(f"upstream Kafka refused the record ({name}): {detail}")


def _json_position(doc: object, pos: object) -> str:
    """``line L, column C`` of character ``pos`` in ``doc``."""
    if not isinstance(doc, str) or not isinstance(pos, int):
        return f"character {pos}"
    line = doc.count("\n", 0, pos) + 1
    column = pos - (doc.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def _validation_problem(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    kind = first.get("type", "")
    loc = [str(x) for x in first.get("loc", ())]
    if kind == "json_invalid":
        where = _json_position(exc.body, first.get("loc", (None, None))[-1])
        reason = first.get("ctx", {}).get("error", "JSON decode error")
        return problem(400, f"body: not valid JSON at {where}: {reason}")
    if loc[:1] in (["body"], ["path"], ["query"], ["header"]):
        loc = loc[1:]
    if not loc:
        if kind == "missing":
            return problem(400, "body: a JSON object is required (Content-Type: application/json)")
        if isinstance(first.get("input"), bytes):  # not parsed: not sent as JSON
            return problem(400, "body: must be JSON, sent with Content-Type: application/json")
        return problem(400, f"body: must be a JSON object: {first.get('msg', 'invalid')}")
    if len(loc) > 1 and loc[0] != "headers":
        loc = loc[:1]  # pydantic names the member of a union (deliver_at.int): the field it is
    field = ".".join(loc)
    return problem(400, f"{field}: {first.get('msg', 'invalid')}", field)


def _http_problem(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's and FastAPI's HTTPException (the router's 404 and 405, FastAPI's 400 for a
    body it cannot parse) in the one shape; their attributes are read, not their class, which
    is Starlette's (not a dependency of ours)."""
    status = int(getattr(exc, "status_code", 500))
    detail = str(getattr(exc, "detail", ""))
    what = f"{request.method} {request.url.path}"
    headers = dict(getattr(exc, "headers", None) or {})
    if status == 404 and detail == "Not Found":
        return problem(404, f"{what}: no such route (the API is described at /docs)")
    if status == 405 and detail == "Method Not Allowed":
        allowed = headers.get("allow") or headers.get("Allow") or "?"
        return problem(405, f"{what}: method not allowed here; allowed: {allowed}", None, headers)
    if status == 400 and isinstance(exc.__cause__, ValueError):
        # FastAPI's "There was an error parsing the body": say which error.
        cause = exc.__cause__
        if "digits" in str(cause):
            limit = sys.get_int_max_str_digits()
            return problem(400, f"body: a number has more than {limit:,} digits")
        if isinstance(cause, UnicodeError):
            return problem(400, "body: not valid UTF-8")
        return problem(400, f"body: cannot be read as JSON: {type(cause).__name__}: {cause}")
    return problem(status, detail, None, headers)


def install(app: FastAPI, metrics: ProxyMetrics) -> None:
    """The error shape for every failure of ``app`` (see the module docstring)."""

    @app.exception_handler(RequestValidationError)
    async def validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_problem(exc)

    async def http_exception(request: Request, exc: Exception) -> JSONResponse:
        return _http_problem(request, exc)

    # By status: the router and FastAPI raise Starlette's HTTPException, FastAPI's base class.
    for status in _FRAMEWORK_STATUSES:
        app.add_exception_handler(status, http_exception)
    app.add_exception_handler(HTTPException, http_exception)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        if isinstance(exc, OverLimitError):
            metrics.rejected(exc.violation.setting, 1)
        return exc.response()

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "proxy.http_failed",
            method=request.method,
            path=request.url.path,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        return problem(500, f"internal error ({type(exc).__name__}); see the proxy's log")

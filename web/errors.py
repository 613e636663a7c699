"""Every error answers JSON {"error": {"code", "message"}} with its status; 503s say when to retry.

`render()` is the one place an exception becomes an answer: Flask's error
handlers use it, and so do the protocol adapters the front answers with
(protocols/v1.py, protocols/v2.py, in their own shapes).
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.wrappers import Request

from funnel.common.errors import FunnelError, queue_unavailable

SHAPES = "funnel.error_shapes"  # app.extensions: path prefix -> the view answering errors under it


def install(app: Flask) -> None:
    """JSON errors for Funnel's own, Redis's (503) and Werkzeug's (404, 405, 413, ...)."""

    def as_response(exc: Exception):
        for prefix, answer in app.extensions.get(SHAPES, {}).items():
            if request.path == prefix or request.path.startswith(prefix + "/"):
                return answer(exc)
        status, body, headers = render(exc, request)
        response = jsonify(body)
        response.status_code = status
        response.headers.extend(headers)
        return response

    for kind in (FunnelError, redis.RedisError, HTTPException):
        app.register_error_handler(kind, as_response)


def claim(app: Flask, prefixes: tuple[str, ...], answer: Callable[[Exception], Response]) -> None:
    """Errors under these paths answered by `answer` (a protocol's own shape), routing's 404 and 405
    too: those reach no blueprint's handlers, as no rule of its matched."""
    app.extensions.setdefault(SHAPES, {}).update(dict.fromkeys(prefixes, answer))


def render(exc: Exception, req: Request) -> tuple[int, dict, list[tuple[str, str]]]:
    """The status, JSON body and extra headers that answer `exc`; anything unexpected is a 500."""
    if isinstance(exc, redis.RedisError):
        exc = queue_unavailable(exc)
    if isinstance(exc, FunnelError):
        headers = [("Retry-After", retry_after(exc))] if exc.status in (429, 503) else []
        if exc.status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        return exc.status, exc.to_json(), headers
    if not isinstance(exc, HTTPException):
        exc = InternalServerError()
    if exc.code == 413:
        drain_body(req)
    code = (exc.name or "error").lower().replace(" ", "_")
    allow = getattr(exc, "valid_methods", None)  # a 405's: the methods the path takes
    return exc.code or 500, {"error": {"code": code, "message": exc.description}}, \
        [("Allow", ", ".join(allow))] if allow else []


def expected(exc: Exception) -> bool:
    """An error a client caused or Redis did, answered without a traceback in the log."""
    return isinstance(exc, (FunnelError, redis.RedisError, HTTPException))


def retry_after(exc: FunnelError) -> str:
    """A 429's or 503's Retry-After: the limit's or the shedder's estimate when there is one, else a second."""
    return str(max(1, int(exc.retry_after or 1)))


DRAIN_LIMIT = 64 * 1024 * 1024


def drain_body(req: Request) -> None:
    """Read and drop an oversized body, so the client reads our 413 instead of a reset."""
    length = req.content_length or 0
    if length > DRAIN_LIMIT:
        return
    stream = req.environ.get("wsgi.input")
    while length > 0 and stream is not None:
        chunk = stream.read(min(length, 1 << 16))
        if not chunk:
            break
        length -= len(chunk)

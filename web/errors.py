"""Every error answers JSON {"error": {"code", "message"}} with its status; 503s say when to retry."""

from __future__ import annotations

import redis
from flask import Flask, Request, jsonify, request
from werkzeug.exceptions import HTTPException

from funnel.common.errors import FunnelError, Unavailable


def install(app: Flask) -> None:
    """JSON errors for Funnel's own, Redis's (503) and Werkzeug's (404, 405, 413, ...)."""

    @app.errorhandler(FunnelError)
    def funnel_error(exc: FunnelError):
        response = jsonify(exc.to_json())
        response.status_code = exc.status
        if exc.status == 503:
            response.headers["Retry-After"] = retry_after(exc)
        return response

    @app.errorhandler(redis.RedisError)
    def redis_error(exc: redis.RedisError):
        return funnel_error(Unavailable(f"queue unavailable: {type(exc).__name__}"))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code == 413:
            drain_body(request)
        code = (exc.name or "error").lower().replace(" ", "_")
        response = jsonify({"error": {"code": code, "message": exc.description}})
        response.status_code = exc.code or 500
        return response


def retry_after(exc: FunnelError) -> str:
    """A 503's Retry-After: the shedder's estimate when it made one, else a second."""
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

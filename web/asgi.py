"""FUNNEL_WORKER_CLASS=asgi: gunicorn runs uvicorn's worker, and a waiting predict costs no thread.

Under gthread each request is handed from gunicorn's poller to one of 64
threads, and its push and its reply each wake another thread: under one GIL
those hand-offs, not Funnel's work, were most of the web tier's CPU per
request (README, Performance). Here each gunicorn process runs one event loop
(uvloop, httptools' parser). The common predict, the one `PredictPath` takes
(web/predict.py), is answered on the loop itself: the body is read, the
inputs preprocessed and the answer written inline, the push goes out with the
other pushes of the loop's tick (Outbox.push_async) and the reply comes back
through the process's inbox (Inbox.collect_async). Every other request goes
to the same Flask app through a2wsgi's thread pool (FUNNEL_THREADS threads),
so both worker classes give the same answers (tests/integration/test_predict_path.py).
"""

from __future__ import annotations

import asyncio
import io
import time
from http import HTTPStatus
from typing import Any

import orjson
from a2wsgi import WSGIMiddleware
from flask import Flask
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from funnel.web.predict import PredictPath, answer_async
from funnel.web.settings import WebSettings

HEAD_LIMIT = 64 * 1024  # request line and headers, as nginx's large_client_header_buffers allow at most
HEAD_TIMEOUT_S = 10.0  # a request's head must arrive whole this soon after its first byte (or the connection)
BODY_IDLE_S = 10.0  # a predict's body may pause this long at most (nginx's client_body_timeout)
DRAIN_LIMIT = 64 * 1024 * 1024  # a body declared over the limit is read this far to answer its 413


class Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1 protocol with the limits gunicorn and nginx put on a request's head.

    uvicorn keeps every header line it is sent and waits as long as a client likes for
    the end of the headers: without nginx in front, a few slow or endless heads would
    hold memory and connections for good. Here a head over HEAD_LIMIT is answered 431
    and one that takes over HEAD_TIMEOUT_S 408, both as JSON, and the connection closed.
    """

    _head_bytes = 0
    _in_head = False  # between a request's first byte and the end of its headers
    _head_timer: asyncio.TimerHandle | None = None  # from the connection's start, or a head's first read

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._writes = _OneWrite(transport, self.loop)
        self._start_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A head not whole by the end of what came gets its timer; most arrive in one read.
        if self._in_head and self._head_timer is None and not self.transport.is_closing():
            self._start_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._in_head = 0, True

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head()
        super().on_headers_complete()
        self.cycle.transport = self._writes  # type: ignore[assignment]  # the response's writes, coalesced

    def send_400_response(self, msg: str) -> None:
        if not self.transport.is_closing():  # refused already: _count stopped the parser
            super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head()
        super().connection_lost(exc)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > HEAD_LIMIT:
            self._refuse(431, "header_too_large", f"the request line and headers are over {HEAD_LIMIT} bytes")
            raise ValueError("head over the limit")  # stops httptools' parser: nothing more of it is read

    def _start_head(self) -> None:
        self._head_timer = self.loop.call_later(
            HEAD_TIMEOUT_S, self._refuse, 408, "request_timeout",
            f"the request's headers did not arrive within {HEAD_TIMEOUT_S:g} s")

    def _stop_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._stop_head()
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": {"code": code, "message": message}})
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
        self.transport.write(head.encode() + body)
        self.transport.close()


class _OneWrite:
    """The transport as a response sees it: what it writes in one turn of the loop goes out in one write.

    uvicorn writes a response's head and its body with a write each. On loopback (nginx in
    front, or a client on the same host) each write is a trip through the TCP stack and a
    wake-up of the reader: for a predict's small JSON answer the head's write was as dear as
    the body's (py-spy, text, 32 clients), as under gthread (web/response.py). Held writes go
    out together at the loop's next turn, or before a close; their order is kept.
    """

    __slots__ = ("transport", "loop", "held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self.transport, self.loop = transport, loop
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.held:
            self.loop.call_soon(self.flush)
        self.held.append(data)

    def flush(self) -> None:
        if self.held:
            held, self.held = self.held, []
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class Worker(UvicornWorker):
    """gunicorn's worker class for the ASGI front (web/server.py names it)."""

    # No lifespan events (nothing to start: the inbox and outbox start at the first request) and
    # no uvicorn access log: it would format a line per request; FUNNEL_ACCESS_LOG logs predicts.
    CONFIG_KWARGS = {"loop": "uvloop", "http": Protocol, "lifespan": "off", "access_log": False}


class Front:
    """The ASGI app: the common predict on the loop, everything else to Flask."""

    def __init__(self, app: Flask, settings: WebSettings):
        self.flask = WSGIMiddleware(_input_terminated(app), workers=settings.threads)
        path = app.wsgi_app if isinstance(app.wsgi_app, PredictPath) else None
        # The loop's predict needs the inbox and the outbox (neither on a cluster, nor when turned off).
        self.path = path if path and path.gateway.inbox and path.gateway.outbox else None

    async def __call__(self, scope: Any, receive, send) -> None:
        if scope["type"] != "http" or self.path is None or scope["method"] != "POST":
            return await self.flask(scope, receive, send)
        environ = _environ(scope)
        name = self.path.ours(environ)
        if name is None:
            return await self.flask(scope, receive, send)
        started = time.perf_counter()
        request = self.path.request(environ)
        result: dict | Exception
        try:
            body = await _body(receive, request.content_length, self.path.max_body)
            if body is None:
                return  # the client left before sending its body: nobody to answer
            environ["wsgi.input"] = io.BytesIO(body)  # multipart forms are parsed from the stream
            request.body = body
            result = await answer_async(self.path.models[name], name, request, self.path.gateway,
                                        self.path.settings)
        except Exception as exc:
            result = exc
        status, data, headers = self.path.respond(name, request, result, started)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()),
                                *((k.lower().encode(), v.encode()) for k, v in headers)]})
        await send({"type": "http.response.body", "body": data})


async def _body(receive, declared: int | None, limit: int) -> bytes | None:
    """The whole body, or None if the client disconnected; 413 past the limit, 408 if it stalls.

    A body over the limit, declared so or found so (chunked), is read and dropped (up
    to DRAIN_LIMIT) before its 413, so that the client, still sending, reads the 413
    rather than a reset connection.
    """
    chunks: list[bytes] = []
    size = 0
    over = declared is not None and declared > limit
    message = await receive()  # mostly the whole body, read with the head
    while True:
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        over = over or size > limit
        if not over:
            chunks.append(chunk)
        if not message.get("more_body") or size > DRAIN_LIMIT:
            if over:
                raise RequestEntityTooLarge()
            return b"".join(chunks)
        try:
            async with asyncio.timeout(BODY_IDLE_S):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(f"the body paused for over {BODY_IDLE_S:g} s") from None


def _environ(scope: dict) -> dict[str, Any]:
    """The WSGI environ werkzeug reads a predict from (PEP 3333), its body put in once read.

    a2wsgi's build_environ does the same for Flask's routes, but looks SCRIPT_NAME up in
    os.environ on every request, a twentieth of a predict's CPU at 512 clients.
    """
    environ: dict[str, Any] = {"REQUEST_METHOD": scope["method"], "SCRIPT_NAME": "",
                               "PATH_INFO": scope["path"].encode().decode("latin-1"),
                               "QUERY_STRING": scope["query_string"].decode("latin-1"),
                               "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
                               "wsgi.url_scheme": scope.get("scheme", "http"), "wsgi.input": io.BytesIO(),
                               "wsgi.input_terminated": True}  # read whole: a chunked body has no length
    for name, value in scope["headers"]:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        text = value.decode("latin-1")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ


def _input_terminated(app: Any):
    """gunicorn tells WSGI apps that a chunked body ends where its stream does; a2wsgi does not,
    and werkzeug would then read a body without Content-Length as empty."""

    def wsgi(environ: dict, start_response):
        environ.setdefault("wsgi.input_terminated", True)
        return app(environ, start_response)

    return wsgi

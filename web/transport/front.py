"""The ASGI app each web process serves: predict-like routes on the event loop, the rest to Flask.

    POST /v1/models/<name>[/versions/<v>]/predict         protocols/v1.py  } the body read here, the API
    POST /v2/models/<name>[/versions/<v>]/infer           protocols/v2.py  } key checked, then web/pipeline.py
    POST /v1/embeddings (the model named in the body)     protocols/openai.py }
    POST /v1/models/<name>/predict asking for a job       Flask: routes/jobs.py (Prefer: respond-async,
                                                          or a Webhook-URL)
    another method on those three paths                   405, Allow: POST, in the protocol's shape
    everything else (the page, listings, jobs, probes,    Flask (web/app.py), through a2wsgi's threads
    metrics)

Every predict-like request is counted in the metrics here, with its status.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
from typing import Any

import orjson
from a2wsgi import WSGIMiddleware
from flask import Flask
from werkzeug.exceptions import MethodNotAllowed, RequestEntityTooLarge, RequestTimeout
from werkzeug.wrappers import Request

from funnel.common.errors import BadInput
from funnel.common.observability import logs
from funnel.web import metrics
from funnel.web.pipeline import Adapter, Origin, Pipeline
from funnel.web.protocols import openai, v1, v2
from funnel.web.routes.jobs import WEBHOOK_HEADER, wants_async
from funnel.web.settings import WebSettings
from funnel.web.transport.protocol import ON_LEAVE

CLIENT_LEFT = 499  # counted as nginx logs a client that closed before its answer; never sent
BODY_IDLE_S = 10.0  # a predict's body may pause this long at most (nginx's client_body_timeout)
DRAIN_LIMIT = 64 * 1024 * 1024  # a body declared over the limit is read this far to answer its 413
WEBHOOK_KEY = "HTTP_" + WEBHOOK_HEADER.upper().replace("-", "_")


class _Json:  # stands in for the json module
    """werkzeug's Request reads JSON through `json_module`: orjson here, as Flask's provider."""

    loads = staticmethod(orjson.loads)


class PredictRequest(Request):
    json_module = _Json  # type: ignore[assignment]  # any object with loads()
    body: bytes | None = None  # the whole body, once the front has read it

    def get_data(self, cache: bool = True, as_text: bool = False, parse_form_data: bool = False):
        """The body read already, without werkzeug's stream around it to read it again; werkzeug's
        own read for a multipart form, which it parses from the stream."""
        if self.body is None or parse_form_data:
            return super().get_data(cache, as_text, parse_form_data)  # type: ignore[call-overload]
        return self.body.decode(errors="replace") if as_text else self.body


class Front:
    def __init__(self, flask_app: Flask, pipeline: Pipeline, settings: WebSettings):
        self.flask = WSGIMiddleware(_input_terminated(flask_app), workers=settings.threads)
        self.pipeline, self.settings = pipeline, settings
        self.v1 = v1.V1(settings.max_items)
        self.openai = openai.OpenAIEmbeddings(settings.max_items)
        self.routes: list[tuple[re.Pattern, Adapter]] = [(v1.PATH, self.v1), (v2.PATH, v2.V2(settings.max_items)),
                                                         (openai.PATH, self.openai)]
        self.max_body = int(settings.max_body_mb * 1024 * 1024)

    async def __call__(self, scope: Any, receive, send) -> None:
        route = self._route(scope) if scope["type"] == "http" else None
        if route is None:
            return await self.flask(scope, receive, send)
        adapter, params = route
        environ = _environ(scope)
        if scope["method"] != "POST":  # these paths take nothing else: 405, in the protocol's own shape
            request_id = logs.request_id_of(environ.get("HTTP_X_REQUEST_ID"))
            status, data, headers = adapter.render_error(MethodNotAllowed(["POST"]), Request(environ))
            return await _answer(send, status, data, headers, request_id)
        if adapter is self.v1 and (wants_async(environ.get("HTTP_PREFER", "")) or WEBHOOK_KEY in environ):
            return await self.flask(scope, receive, send)
        started = time.perf_counter()
        request = PredictRequest(environ)
        request.max_content_length = self.max_body
        request_id = logs.request_id_of(environ.get("HTTP_X_REQUEST_ID"))
        logs.REQUEST_ID.set(request_id)  # this request's task's own: every log line about it names it
        origin: Origin | None = None  # known once its key is checked
        try:
            body = await _body(receive, request.content_length, self.max_body)
            if body is None:
                return  # the client left before sending its body: nobody to answer
            environ["wsgi.input"] = io.BytesIO(body)  # multipart forms are parsed from the stream
            request.body = body
            try:
                origin = self._origin(request_id, environ, environ.get("HTTP_X_PRIORITY"))
            except BadInput:  # a priority that is no lane, from a known key: counted under the key
                origin = self._origin(request_id, environ, None)  # in normal: a label never holds client text
                raise
            if adapter is self.openai:  # its model is named in the body, not the path
                params = {"name": self.openai.model_of(request)}
            streamed = v1.stream_kind(environ.get("HTTP_ACCEPT", "")) if adapter is self.v1 else None
            if streamed is not None:
                events = v1.Events(kind=streamed, model=params["name"])
                status = await self._stream(scope, send, request, params, origin, events)
                self._count(params.get("name", ""), status, started, request, origin, [])
                return
        except Exception as exc:
            status, data, headers = adapter.render_error(exc, request)
        else:
            status, data, headers = await self._respond(scope, adapter, request, params, origin)
        self._count(params.get("name", ""), status, started, request, origin, headers)
        if status == CLIENT_LEFT:
            return  # nobody to answer
        await _answer(send, status, data, headers, request_id)

    async def _respond(self, scope: Any, adapter: Adapter, request: PredictRequest, params: dict[str, str],
                       origin: Origin) -> tuple[int, bytes, list[tuple[str, str]]]:
        """The pipeline's answer; CLIENT_LEFT if the client leaves first."""
        left = _on_leave(scope)
        try:
            if left:  # gone while its request was read: nothing to queue
                raise asyncio.CancelledError
            return await self.pipeline.respond(adapter, request, params["name"], params.get("version"), origin)
        except asyncio.CancelledError:
            if not left:
                raise  # the server is stopping, not the client leaving
            return CLIENT_LEFT, b"", []

    async def _stream(self, scope: Any, send, request: PredictRequest, params: dict[str, str], origin: Origin,
                      events: v1.Events) -> int:
        """A /v1 predict answered as a stream (protocols/v1.py, `Events`): once its first job is answered,
        a 200 and each job's items as events as they come, then the last event; a request that fails
        before any item is answered gets its JSON error as it would unstreamed. The status, to count
        (CLIENT_LEFT if the client leaves first: its jobs not yet run are dropped)."""
        left = _on_leave(scope)
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        answered = [0]

        def each(first: int, count: int, reply) -> None:
            answered[0] += count
            chunks.put_nowait(events.items(first, count, reply, origin.priority))

        respond = asyncio.ensure_future(self.pipeline.respond(self.v1, request, params["name"], params.get("version"),
                                                              origin, each))
        opened = False

        async def chunk(data: bytes, more: bool = True) -> None:
            nonlocal opened
            if not opened:
                opened = True
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", events.content_type.encode()), (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"), (b"x-request-id", events.request_id.encode())]})
            await send({"type": "http.response.body", "body": data, "more_body": more})

        try:
            if left:  # gone while its request was read: nothing to queue
                raise asyncio.CancelledError
            while not respond.done() or not chunks.empty():
                getter = asyncio.ensure_future(chunks.get())
                await asyncio.wait({getter, respond}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    await chunk(getter.result())
                else:
                    getter.cancel()
            status, body, headers = respond.result()
            if not opened and status != 200:
                await _answer(send, status, body, headers, events.request_id)
                return status
            if not answered[0] and status == 200:  # a cached model's items come whole: an event each
                await chunk(events.whole(body))
            await chunk(events.end(status, body, answered[0] or events.count(body)), more=False)
            return status
        except asyncio.CancelledError:
            respond.cancel()  # its jobs marked as a leaving client's (web/pipeline.py)
            if not left:
                raise  # the server is stopping, not the client leaving
            return CLIENT_LEFT

    def _origin(self, request_id: str, environ: dict[str, Any], asked_priority: str | None) -> Origin:
        """Who sent the request (401 without a key where keys are set; 400 for a priority that is no lane)."""
        return Origin.of(request_id, environ.get("HTTP_AUTHORIZATION", ""), self.settings.api_keys,
                         environ.get("HTTP_TRACEPARENT", ""), environ.get("HTTP_TRACESTATE", ""), asked_priority)

    def _count(self, name: str, status: int, started: float, request: PredictRequest, origin: Origin | None,
               headers: list[tuple[str, str]]) -> None:
        """/metrics: the request by model and status, and by its key and lane once its key was known."""
        name = name if self.pipeline.catalog.versions(name) else "unknown"
        metrics.count(name, status, time.perf_counter() - started, request.content_length, self.settings.access_log)
        if origin is not None:
            metrics.count_key(name, origin.label, dict(headers).get("X-Priority", origin.priority), status)

    def _route(self, scope: Any) -> tuple[Adapter, dict[str, str]] | None:
        path = scope["path"]
        for pattern, adapter in self.routes:
            match = pattern.fullmatch(path)
            if match:
                return adapter, match.groupdict()
        return None


async def _answer(send, status: int, data: bytes, headers: list[tuple[str, str]], request_id: str) -> None:
    headers = [*headers, ("X-Request-ID", request_id)]
    if not any(k.lower() == "content-type" for k, _ in headers):
        headers = [("Content-Type", "application/json"), *headers]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(data)).encode()),
                            *((k.lower().encode(), v.encode()) for k, v in headers)]})
    await send({"type": "http.response.body", "body": data})


def _on_leave(scope: Any) -> list[bool]:
    """Cancel this request's task if its client leaves before the answer (transport/protocol.py calls
    back): the pipeline stops waiting and marks its jobs, so no worker runs them. The list returned
    says whether that happened."""
    left: list[bool] = []
    task = asyncio.current_task()
    departure = scope.get(ON_LEAVE)
    if task is not None and departure is not None:

        def leave() -> None:
            left.append(True)
            task.cancel()

        if not departure.on_leave(leave):  # gone already: the caller queues nothing
            left.append(True)
    return left


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
    os.environ on every request, a cost a predict need not pay (docs/performance.md).
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

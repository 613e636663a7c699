"""POST /v1/models/<name>/predict: read, preprocess, queue, answer.

`answer()` is the whole of a predict. The Flask route calls it, and so does
`PredictPath`, which wraps the Flask app as WSGI and serves the common case
(no async preference, no webhook, a valid API key or none needed) without
Flask's request context, URL routing, hooks and signals: under load those
cost more web CPU per request than Funnel's own work (README, Performance).
Every other request, and every other route, goes on to Flask, so a request
answered either way gets the same answer, error shapes and metrics.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from werkzeug.wrappers import Request

from funnel.common.errors import REPLY_STATUS, FunnelError
from funnel.common.tasks import Task
from funnel.common.wire import Reply
from funnel.web import auth, errors
from funnel.web import metrics as web_metrics
from funnel.web.gateway import Gateway
from funnel.web.inputs import read_items
from funnel.web.jsonio import OPTIONS
from funnel.web.settings import WebSettings
from funnel.web.shedding import request_timeout

log = logging.getLogger("funnel.web")

PATH = re.compile(r"/v1/models/([^/]+)/predict")
# Either header makes the request a job (web/jobs.py), which Flask's hook answers.
TO_FLASK = ("HTTP_PREFER", "HTTP_WEBHOOK_URL")


def answer(task: Task, name: str, request: Request, gateway: Gateway, settings: WebSettings) -> dict:
    """One predict's JSON answer; a FunnelError for a bad input or a failed reply."""
    inputs, single, timeout_s = read(task, request, settings)
    return answered(name, gateway.submit(name, inputs, timeout_s), single)


async def answer_async(task: Task, name: str, request: Request, gateway: Gateway, settings: WebSettings) -> dict:
    """answer() on the event loop (web/asgi.py): reading and preprocessing run inline, waiting awaits."""
    inputs, single, timeout_s = read(task, request, settings)
    return answered(name, await gateway.submit_async(name, inputs, timeout_s), single)


def read(task: Task, request: Request, settings: WebSettings) -> tuple[list, bool, float]:
    """The request's preprocessed inputs, whether it sent one item, and its deadline in seconds."""
    items, single = read_items(task.input_kind, request, settings.max_items)
    inputs = [task.preprocess(item) for item in items]
    return inputs, single, request_timeout(request.headers, settings.request_timeout_s)


def answered(name: str, replies: list[Reply], single: bool) -> dict:
    web_metrics.replied(name, replies)
    for i, reply in enumerate(replies):
        if not reply.ok:
            raise reply_error(reply, i, len(replies))
    results = [reply.outputs or {} for reply in replies]  # numpy arrays are written by orjson
    meta = [{"worker": r.worker, "batch_size": r.batch_size,
             "queue_ms": round(r.queue_ms, 2), "infer_ms": round(r.infer_ms, 2)} for r in replies]
    if single:
        return {"model": name, **results[0], "meta": meta[0]}
    return {"model": name, "results": results, "meta": meta}


def reply_error(reply: Reply, index: int, count: int) -> FunnelError:
    error = reply.error or {}
    code, message = error.get("code", "inference_failed"), error.get("message", "")
    if count > 1:
        message = f"item {index}: {message}"
    return FunnelError(message, code=code, status=REPLY_STATUS.get(code, 500))


class _Json:  # stands in for the json module
    """werkzeug's Request reads JSON through `json_module`: orjson here, as Flask's provider."""

    loads = staticmethod(orjson.loads)


class PredictRequest(Request):
    json_module = _Json  # type: ignore[assignment]  # any object with loads()
    body: bytes | None = None  # the whole body, when the ASGI front has read it already

    def get_data(self, cache: bool = True, as_text: bool = False, parse_form_data: bool = False):
        """The body read already, without werkzeug's stream around it to read it again (half the
        CPU of reading a text predict); werkzeug's own read otherwise."""
        if self.body is None or parse_form_data:
            return super().get_data(cache, as_text, parse_form_data)  # type: ignore[call-overload]
        return self.body.decode(errors="replace") if as_text else self.body


class PredictPath:
    """WSGI in front of the Flask app: the common predict, answered without Flask's machinery."""

    def __init__(self, flask_app: Callable, models: dict[str, Task], gateway: Gateway, settings: WebSettings):
        self.flask_app, self.models, self.gateway, self.settings = flask_app, models, gateway, settings
        self.max_body = int(settings.max_body_mb * 1024 * 1024)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        name = self.ours(environ)
        if name is None:
            return self.flask_app(environ, start_response)
        started = time.perf_counter()
        request = self.request(environ)
        try:
            result: dict | Exception = answer(self.models[name], name, request, self.gateway, self.settings)
        except Exception as exc:
            result = exc
        status, data, headers = self.respond(name, request, result, started)
        start_response(errors.status_line(status), [("Content-Type", "application/json"),
                                                    ("Content-Length", str(len(data))), *headers])
        return [data]

    def request(self, environ: dict) -> PredictRequest:
        request = PredictRequest(environ)
        request.max_content_length = self.max_body
        return request

    def respond(self, name: str, request: Request, result: dict | Exception,
                started: float) -> tuple[int, bytes, list[tuple[str, str]]]:
        """Status, JSON and extra headers for an answer or its failure, counted in the metrics."""
        headers: list[tuple[str, str]] = []
        try:
            if isinstance(result, Exception):
                raise result
            status, data = 200, orjson.dumps(result, option=OPTIONS)
        except Exception as exc:  # every failure answers as Flask's error handlers would (web/errors.py)
            if not errors.expected(exc):
                log.exception("predict %s failed", name, exc_info=exc)
            status, body, headers = errors.render(exc, request)
            data = orjson.dumps(body)
        web_metrics.count(name, status, time.perf_counter() - started, request.content_length,
                          self.settings.access_log)
        return status, data, headers

    def ours(self, environ: dict[str, Any]) -> str | None:
        """The model's name when this is a predict PredictPath answers; None sends it to Flask."""
        if environ.get("REQUEST_METHOD") != "POST":
            return None
        match = PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or match[1] not in self.models or any(h in environ for h in TO_FLASK):
            return None
        keys = self.settings.api_keys
        if keys and not auth.authorized(environ.get("HTTP_AUTHORIZATION", ""), keys):
            return None  # Flask's hook answers the 401
        return match[1]

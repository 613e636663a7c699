"""Async and bulk jobs over HTTP: the routes (common/bulk/job_store.py keeps the jobs).

    POST   /v1/models/<name>/jobs   {"texts": [...]} (or {"inputs": [...]}), up to FUNNEL_MAX_JOB_ITEMS;
                                    an image model: multipart, one `file` field per image
    POST   /v1/models/<name>/predict with `Prefer: respond-async`: the same request, as a job
    GET    /v1/jobs/<id>?offset=0&limit=100   state, progress, a page of results
    GET    /v1/jobs/<id>/results?offset=0     every result, in input order, as JSON Lines
    DELETE /v1/jobs/<id>                      cancel: items not yet taken never run

A submit answers 202 with the job's status and `Location: /v1/jobs/<id>`
once the record and every item are in Redis. `Idempotency-Key` makes a
retried submit answer the job the first one created (`Idempotent-Replayed:
true`; 422 if the body differs). A submit may name a webhook (the body's
"webhook", or a `Webhook-URL` header), POSTed the job's status when it is
final (worker/webhook.py).

Where API keys are set, a job is its submitter's (docs/jobs.md, "Ownership"):
each route finds the request's key once (web/auth.py's caller) and hands it to
the pipeline or the job store, which answer another key's job as one that
never existed (404 unknown_job), and keep each key's Idempotency-Keys apart;
an admin key (FUNNEL_ADMIN_KEYS) reads and cancels any job.

Each route parses the request, calls the pipeline's submit_job (web/pipeline.py)
or the job store (common/bulk/job_store.py) and renders JSON; their errors are
FunnelErrors, answered by web/errors.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from flask import Blueprint, Flask, Response, jsonify, request

from funnel.common.bulk import jobs
from funnel.common.bulk.job_submit import WEBHOOK_HEADER
from funnel.common.contracts.wire import WireError, decode_reply
from funnel.common.errors import BadInput, FunnelError
from funnel.common.observability import logs
from funnel.web import auth
from funnel.web.jsonio import OPTIONS
from funnel.web.pipeline import Origin, Pipeline
from funnel.web.protocols.inputs import read_files, read_images, read_items, read_json_items
from funnel.web.settings import WebSettings

DEFAULT_PAGE, MAX_PAGE = 100, 1000
EVENTS_POLL_S = 0.2  # how often a job's events stream reads it while nothing new is answered
EVENTS_MAX_S = 300.0  # a job's events stream's longest life: its client resumes from the last id


def wants_async(prefer: str) -> bool:
    """Whether a Prefer header (RFC 7240) asks for respond-async."""
    return any(part.split(";")[0].strip().lower() == "respond-async" for part in prefer.split(","))


def install(app: Flask, pipeline: Pipeline, settings: WebSettings) -> None:
    """The jobs routes, and the predict view that answers `Prefer: respond-async` (endpoint
    predict_async: the front sends it the predicts that ask for a job); every one after the API
    key check."""
    routes = JobRoutes(pipeline, settings)
    blueprint = Blueprint("jobs", __name__)
    blueprint.add_url_rule("/v1/models/<name>/jobs", "submit", routes.submit, methods=["POST"])
    blueprint.add_url_rule("/v1/jobs/<job_id>", "status", routes.status, methods=["GET"])
    blueprint.add_url_rule("/v1/jobs/<job_id>/results", "results", routes.results, methods=["GET"])
    blueprint.add_url_rule("/v1/jobs/<job_id>/events", "events", routes.events, methods=["GET"])
    blueprint.add_url_rule("/v1/jobs/<job_id>", "cancel", routes.cancel, methods=["DELETE"])
    app.register_blueprint(blueprint)
    app.add_url_rule("/v1/models/<name>/predict", "predict_async", routes.predict_async, methods=["POST"])


class JobRoutes:
    """The views: each parses its request, calls the pipeline or the job store, and renders JSON."""

    def __init__(self, pipeline: Pipeline, settings: WebSettings):
        self.pipeline, self.store, self.settings = pipeline, pipeline.bulk_jobs, settings

    def submit(self, name: str) -> Response:
        task = self.pipeline.resolve(name)
        if task.input_kind in ("image", "file"):
            request.get_data()  # cached before the multipart parse consumes it: the Idempotency-Key's check
            most = min(self.settings.max_job_items, self.settings.max_job_images)
            items: list[Any] = read_images(request, most) if task.input_kind == "image" else \
                read_files(task, request, most)
            return self._submitted(name, items, webhook_of(request.form.get("webhook")))
        one, many = ("text", "texts") if task.input_kind == "text" else ("input", "inputs")
        items, _ = read_json_items(request, one, many, self.settings.max_job_items)
        if task.input_kind == "text" and not all(isinstance(t, str) for t in items):
            raise BadInput("every text must be a string", code="bad_json")
        return self._submitted(name, items, webhook_of((request.get_json(silent=True) or {}).get("webhook")))

    def predict_async(self, name: str) -> Response:
        """A predict that asks for a job: with `Prefer: respond-async`, its items become one (202);
        a Webhook-URL without it is a 400, since a webhook only ever follows a job."""
        if not wants_async(request.headers.get("Prefer", "")):
            if WEBHOOK_HEADER in request.headers:
                raise BadInput(f"{WEBHOOK_HEADER} needs 'Prefer: respond-async'", code="bad_webhook")
            raise FunnelError("an interactive predict is the front's to answer (web/transport/front.py), "
                              "not Flask's", code="misrouted", status=500)
        task = self.pipeline.resolve(name)
        request.get_data()  # cached before a multipart parse consumes it: the Idempotency-Key's body check
        items, _ = read_items(task, request, self.settings.max_items)
        response = self._submitted(name, items, webhook_of(None))
        response.headers["Preference-Applied"] = "respond-async"
        return response

    def _submitted(self, name: str, items: list[Any], webhook: str | None) -> Response:
        # The request's id and the client's trace context: the job's span (when traced) is their child.
        origin = Origin(request_id=logs.REQUEST_ID.get(), traceparent=request.headers.get("traceparent", ""),
                        tracestate=request.headers.get("tracestate", ""))
        record, replayed = self.pipeline.submit_job(name, items, request.headers.get("Idempotency-Key"), webhook,
                                                    request.get_data(), auth.caller(self.settings), origin)
        return accepted(record, replayed)

    def status(self, job_id: str) -> Response:
        offset = int_arg("offset", 0, 0, None)
        limit = int_arg("limit", DEFAULT_PAGE, 0, MAX_PAGE)
        record, payloads = self.store.load(job_id, auth.caller(self.settings), offset, limit)
        return jsonify(describe(record, (offset, limit, payloads)))

    def results(self, job_id: str) -> Response:
        """Every result from offset on, one JSON value a line, in input order (null: not answered
        yet), read a chunk at a time: a 100,000-item job never sits in memory whole."""
        offset = int_arg("offset", 0, 0, None)
        record, _ = self.store.load(job_id, auth.caller(self.settings))

        def lines() -> Iterator[bytes]:
            for payloads in self.store.result_pages(record, offset):
                yield b"".join(orjson.dumps(result(p), option=OPTIONS) + b"\n" for p in payloads)

        response = Response(lines(), mimetype="application/x-ndjson")
        response.headers["Funnel-Job-State"] = record.state  # as the stream began
        return response

    def events(self, job_id: str) -> Response:
        """Server-Sent Events of the job: `progress` (its status) as it moves, `page` (the results
        from `offset` on, in input order) as they are answered, and `done` (its final status) once
        every result is sent (`expired` if it expires meanwhile). Each event's id is the offset of the
        next result, from which a reconnecting client resumes (`Last-Event-ID`, or ?offset=); a stream
        ends after EVENTS_MAX_S, for the client to resume so. Another key's job is refused as for its status."""
        caller = auth.caller(self.settings)
        resumed = request.headers.get("Last-Event-ID", "")
        offset = int(resumed) if resumed.isascii() and resumed.isdigit() else int_arg("offset", 0, 0, None)
        self.store.load(job_id, caller)  # 404 or 410 before the stream starts

        def stream() -> Iterator[bytes]:
            at, shown, ends = offset, None, time.monotonic() + EVENTS_MAX_S
            paging = True  # whether this read takes results too: an idle poll reads the record alone
            while True:
                try:
                    record, payloads = self.store.load(job_id, caller, at, MAX_PAGE if paging else 0)
                except FunnelError as exc:  # expired meanwhile
                    yield event("expired", at, {"error": {"code": exc.code, "message": exc.message}})
                    return
                final = record.state in ("done", "failed", "cancelled")
                status = record.status()
                moved = status["progress"] != shown
                if moved:
                    shown = status["progress"]
                    yield event("progress", at, status)
                if not paging and (moved or final):
                    paging = True
                    continue  # its new results, read at once
                ready = payloads if final else payloads[:next((i for i, p in enumerate(payloads) if p is None),
                                                              len(payloads))]
                if ready:
                    yield event("page", at + len(ready), {"offset": at, "results": [result(p) for p in ready]})
                    at += len(ready)
                    continue  # more may be answered already
                if final and at >= record.total:
                    yield event("done", at, status)
                    return
                if time.monotonic() > ends:
                    return
                paging = False
                time.sleep(EVENTS_POLL_S)

        response = Response(stream(), mimetype="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Accel-Buffering"] = "no"
        return response

    def cancel(self, job_id: str) -> Response:
        return jsonify(describe(self.store.cancel(job_id, auth.caller(self.settings))))


def event(name: str, next_offset: int, data: dict) -> bytes:
    """One Server-Sent Event; its id is where a client that reconnects resumes."""
    return f"id: {next_offset}\nevent: {name}\ndata: ".encode() + orjson.dumps(data, option=OPTIONS) + b"\n\n"


def accepted(record: jobs.Record, replayed: bool) -> Response:
    """202 with the job's status; Idempotent-Replayed when an earlier submit made it."""
    response = jsonify(describe(record))
    response.status_code = 202
    response.headers["Location"] = f"/v1/jobs/{record.id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def describe(record: jobs.Record, page: tuple[int, int, list] | None = None) -> dict:
    """A job's status, with a page of results (offset, limit, payloads) when given."""
    body = record.status()
    if page is not None:
        offset, limit, payloads = page
        body["results"] = [result(p) for p in payloads]
        body["offset"], body["limit"] = offset, limit
        end = offset + len(payloads)
        body["next_offset"] = end if end < record.total else None
    return body


def result(payload: bytes | None) -> dict | None:
    """One item's result as predict answers it, its error, or None when not answered yet."""
    if payload is None:
        return None
    try:
        reply = decode_reply(payload)
    except WireError as exc:
        return {"error": {"code": "bad_reply", "message": str(exc)}}
    if reply.ok:
        return reply.outputs or {}
    return {"error": reply.error}


def int_arg(name: str, default: int, low: int, high: int | None) -> int:
    """A query argument as an integer within [low, high]; 400 bad_query otherwise."""
    text = request.args.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"{name} must be an integer", code="bad_query") from None
    if value < low or (high is not None and value > high):
        raise BadInput(f"{name} must be between {low} and {high if high is not None else 'any'}",
                       code="bad_query")
    return value


def webhook_of(in_body: Any) -> str | None:
    """The submit's webhook URL: the body's "webhook" field or the Webhook-URL header, not both."""
    in_header = request.headers.get(WEBHOOK_HEADER)
    if in_body is not None and in_header is not None:
        raise BadInput(f'give the webhook once: the body\'s "webhook" or the {WEBHOOK_HEADER} header',
                       code="bad_webhook")
    url = in_body if in_body is not None else in_header
    if url is not None and not isinstance(url, str):
        raise BadInput('"webhook" must be a URL string', code="bad_webhook")
    return url

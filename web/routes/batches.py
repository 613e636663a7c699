"""OpenAI's Files and Batch API, as its SDK calls them, over bulk jobs (docs/jobs.md, "OpenAI batches").

    POST   /v1/files                     multipart `file` (JSON Lines) and `purpose` "batch": a FileObject
    GET    /v1/files[?after=&limit=]     the caller's input files, newest first
    GET    /v1/files/<id>                a FileObject (an input, output or error file)
    GET    /v1/files/<id>/content        its bytes: an output or error file rendered from the job's results
    DELETE /v1/files/<id>                an input file deleted
    POST   /v1/batches                   {"input_file_id", "endpoint": "/v1/embeddings", "completion_window": "24h",
                                          "metadata"}: a Batch, its job created
    GET    /v1/batches[?after=&limit=]   the caller's batches, newest first
    GET    /v1/batches/<id>              a Batch: status and request_counts from its job
    POST   /v1/batches/<id>/cancel       the job cancelled: lines not yet taken never run

Each view parses, calls the pipeline's submit_job, the job store or the batch store
(common/bulk/batch_store.py), and renders through protocols/openai_batch.py; errors are
OpenAI's shape (protocols/openai.py). A batch and its files are the API key's that made them, as
a job is (another key's read as one that never was).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from flask import Blueprint, Flask, Response, request

from funnel.common.bulk import jobs
from funnel.common.bulk.batch_store import (
    LINES_FIELD,
    BatchStore,
    Description,
    batch_id,
    job_of_batch,
    parse_file_id,
)
from funnel.common.bulk.job_store import Gone
from funnel.common.contracts.wire import now_ms
from funnel.common.errors import BadInput, NotFound
from funnel.common.observability import logs
from funnel.web import auth, errors
from funnel.web.pipeline import OpenAIBatchItems, Origin, Pipeline
from funnel.web.protocols import openai_batch
from funnel.web.protocols.openai import BadParam, OpenAIEmbeddings
from funnel.web.routes.jobs import int_arg
from funnel.web.settings import WebSettings

MAX_LIST = 100


def install(app: Flask, pipeline: Pipeline, settings: WebSettings) -> None:
    routes = BatchRoutes(pipeline, settings)
    blueprint = Blueprint("batches", __name__)
    for rule, name, view, method in (
            ("/v1/files", "upload", routes.upload, "POST"), ("/v1/files", "files", routes.files, "GET"),
            ("/v1/files/<file_id>", "file", routes.file, "GET"),
            ("/v1/files/<file_id>/content", "content", routes.content, "GET"),
            ("/v1/files/<file_id>", "delete_file", routes.delete_file, "DELETE"),
            ("/v1/batches", "create", routes.create, "POST"), ("/v1/batches", "batches", routes.batches, "GET"),
            ("/v1/batches/<batch>", "batch", routes.batch, "GET"),
            ("/v1/batches/<batch>/cancel", "cancel", routes.cancel, "POST")):
        blueprint.add_url_rule(rule, name, view, methods=[method])
    blueprint.register_error_handler(Exception, routes.error)
    app.register_blueprint(blueprint)
    # OpenAI's paths answer their errors in its shape; of /v1/embeddings the front answers every method,
    # and only a path under it reaches Flask.
    errors.claim(app, ("/v1/files", "/v1/batches", "/v1/embeddings"), routes.error)


def json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status, mimetype="application/json")


def listing(data: list[dict], more: bool) -> Response:
    return json({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                 "last_id": data[-1]["id"] if data else None, "has_more": more})


class BatchRoutes:
    def __init__(self, pipeline: Pipeline, settings: WebSettings):
        self.pipeline, self.jobs, self.settings = pipeline, pipeline.bulk_jobs, settings
        self.store = BatchStore(pipeline.client, pipeline.keys, settings.job_ttl_s)
        self.embeddings = OpenAIEmbeddings(settings.max_items)

    def error(self, exc: Exception) -> Response:
        status, body, headers = self.embeddings.render_error(exc, request)
        response = Response(body, status, mimetype="application/json")
        for name, value in headers:
            response.headers[name] = value
        return response

    # -- files ---------------------------------------------------------------------------------

    def upload(self) -> Response:
        purpose = request.form.get("purpose")
        if purpose != "batch":
            raise BadParam(param="purpose",
                           message="purpose must be 'batch': the only files this server keeps are batch inputs")
        given = request.files.get("file")
        if given is None:
            raise BadParam(param="file", message="send the JSON Lines file as the multipart field 'file'")
        content = given.read()  # within FUNNEL_MAX_BODY_MB, as the request is
        lines = openai_batch.count_lines(content)
        if not 0 < lines <= self.settings.max_job_items:
            raise BadParam(param="file", message=f"the file holds {lines} requests; a batch takes 1 to "
                           f"{self.settings.max_job_items}", code="invalid_file")
        made = self.store.put_file(given.filename or "batch.jsonl", purpose, content, lines, self._caller())
        return json(openai_batch.file_object(made, self.settings.job_ttl_s))

    def files(self) -> Response:
        found, more = self.store.files(self._caller(), request.args.get("after"), self._limit(MAX_LIST * 100))
        return listing([openai_batch.file_object(f, self.settings.job_ttl_s) for f in found], more)

    def file(self, file_id: str) -> Response:
        _, kind = parse_file_id(file_id)
        if not kind:
            return json(openai_batch.file_object(self.store.file(file_id, self._caller()), self.settings.job_ttl_s))
        record, description = self._result_file(file_id)
        size = sum(len(line) for line in self._result_lines(record, description, kind))
        return json(openai_batch.result_file_object(record, kind, size, self.settings.job_ttl_s))

    def content(self, file_id: str) -> Response:
        _, kind = parse_file_id(file_id)
        if not kind:
            return Response(self.store.content(file_id, self._caller()), mimetype="application/jsonl")
        record, description = self._result_file(file_id)
        return Response(self._result_lines(record, description, kind), mimetype="application/jsonl")

    def delete_file(self, file_id: str) -> Response:
        _, kind = parse_file_id(file_id)
        if kind:
            raise BadInput("a batch's output and error files go with its job; delete its input file only",
                           code="not_deletable")
        self.store.delete_file(file_id, self._caller())
        return json({"id": file_id, "object": "file", "deleted": True})

    def _result_file(self, file_id: str) -> tuple[jobs.Record, Description]:
        """The final batch whose output or error file this is; 404 before it is final."""
        hexid, _ = parse_file_id(file_id)
        record, description = self._batch(hexid, lines=True)
        if record.state not in ("done", "failed", "cancelled") or not self._settled(record, description):
            raise NotFound(f"file {file_id} is written once its batch is final", code="unknown_file")
        return record, description

    def _result_lines(self, record: jobs.Record, description: Description, kind: str) -> Iterator[bytes]:
        return openai_batch.result_lines(record, description, kind, self.jobs.result_pages(record))

    # -- batches -------------------------------------------------------------------------------

    def create(self) -> Response:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise BadInput("the body must be a JSON object", code="bad_json")
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint not in openai_batch.ENDPOINTS:
            raise BadParam(param="endpoint", message=f"endpoint must be one of {', '.join(openai_batch.ENDPOINTS)}")
        if window not in openai_batch.WINDOWS:
            raise BadParam(param="completion_window", message="completion_window must be '24h'")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items())):
            raise BadParam(param="metadata",
                           message="metadata: at most 16 string keys (64 characters) and values (512)")
        caller = self._caller()
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or parse_file_id(input_file_id)[1]:
            raise BadParam(param="input_file_id", message="input_file_id must name an uploaded file")
        content = self.store.content(input_file_id, caller)
        read = openai_batch.read_file(content, endpoint, self.embeddings, self.pipeline.resolve,
                                      self.pipeline.prepare, self.settings.max_job_items)
        if read.task is None:
            first = read.rejected[0]
            raise BadParam(param="input_file_id", message=f"no line of the file is a request to run; line "
                           f"{first.number}: {first.message}", code="no_valid_requests")
        description = Description(input_file_id=input_file_id, endpoint=endpoint, completion_window=window,
                                  model=read.task.spec.name, good=len(read.lines), refused=len(read.rejected),
                                  metadata=metadata, lines=read.lines, rejected=read.rejected)
        origin = Origin(request_id=logs.REQUEST_ID.get(), traceparent=request.headers.get("traceparent", ""),
                        tracestate=request.headers.get("tracestate", ""))
        record, replayed = self.pipeline.submit_job(
            read.task.spec.name, read.items, request.headers.get("Idempotency-Key"), None, request.get_data(),
            caller, origin, OpenAIBatchItems(read.task.spec.version, {jobs.BATCH_FIELD: description.encode(),
                                                             LINES_FIELD: description.encode_lines()}))
        if not replayed:
            self.store.added(record.id, caller)
        return self._render(record, self.store.description(record.id) or description)

    def batches(self) -> Response:
        caller = self._caller()
        ids, more = self.store.batches(caller, request.args.get("after"), self._limit(MAX_LIST))
        shown = []
        for job_id in ids:
            try:
                shown.append(self._object(*self._batch(job_id)))
            except (NotFound, Gone):  # expired, or the job's record was never written (a submit that failed)
                continue
        return listing(shown, more)

    def batch(self, batch: str) -> Response:
        return self._render(*self._batch(job_of_batch(batch)))

    def cancel(self, batch: str) -> Response:
        job_id = job_of_batch(batch)
        record, description = self._batch(job_id)
        if record.state in ("queued", "running"):
            description.cancelled_ms = description.cancelled_ms or now_ms()
            self.store.update(job_id, description)
            record = self.jobs.cancel(job_id, self._caller())
        return self._render(record, description)

    def _batch(self, job_id: str, lines: bool = False) -> tuple[jobs.Record, Description]:
        record, _ = self.jobs.load(job_id, self._caller())
        description = self.store.description(job_id, lines)
        if description is None:  # a job of /v1/models/<name>/jobs: no batch
            raise NotFound(f"no batch {batch_id(job_id)!r}", code="unknown_batch")
        return record, description

    def _object(self, record: jobs.Record, description: Description) -> dict:
        settled = self._settled(record, description)
        if openai_batch.needs_scan(record, description) and settled:
            description = self.store.description(record.id, lines=True) or description
        done = openai_batch.counts(record, description, lambda: self.jobs.result_pages(record))
        final = record.state in ("done", "failed") or (record.state == "cancelled" and settled)
        if final and not description.counts and (record.failed or record.state == "cancelled"):
            description.counts = list(done)  # no item will be answered any more: kept, not counted again
            self.store.update(record.id, description)
        return openai_batch.batch_object(record, description, done, self.settings.job_ttl_s, settled)

    def _settled(self, record: jobs.Record, description: Description) -> bool:
        """False while a cancelled batch's items taken before the cancel are still running."""
        return (record.state != "cancelled" or bool(description.counts)
                or not self.store.in_flight(record.id, record.model))

    def _render(self, record: jobs.Record, description: Description) -> Response:
        return json(self._object(record, description))

    def _caller(self) -> jobs.Caller:
        return auth.caller(self.settings)

    def _limit(self, high: int) -> int:
        return int_arg("limit", min(20, high), 1, high)

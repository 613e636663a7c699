"""OpenAI's Batch API over bulk jobs: a batch input file read into a job's items, and the batch, its
files and its output and error lines written in OpenAI's shapes (web/routes/batches.py routes them).

An input file holds one request a line, {"custom_id", "method": "POST", "url": "/v1/embeddings",
"body": <an embeddings request>}. Each line is checked as POST /v1/embeddings checks a request
(protocols/openai.py) and preprocessed as its texts would be; one that fails goes to the error
file, in OpenAI's shape, and never fails the batch. One model a batch, the first good line's, as
OpenAI has it. The good lines' texts become the items of one bulk job, in line order.

An output line is {"id", "custom_id", "response": {"status_code": 200, "request_id", "body": <the
embeddings answer>}, "error": null}; an error line carries the refusal (`response` with its status
and OpenAI's error body) or, for a line that is no request or that a cancel left unanswered,
`response: null` and `error: {"code", "message"}`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from funnel.common.bulk import jobs
from funnel.common.bulk.batch_store import (
    BATCH_PREFIX,
    ERRORS,
    OUTPUT,
    Description,
    File,
    Rejected,
    RequestLine,
    batch_id,
    result_file_id,
)
from funnel.common.contracts.wire import Reply, WireError, decode_reply
from funnel.common.errors import FunnelError, reply_status
from funnel.common.tasks import Inputs, Task
from funnel.web.jsonio import OPTIONS
from funnel.web.protocols.openai import BadParam, OpenAIEmbeddings, answer, error_body, tokens_of

ENDPOINTS = ("/v1/embeddings",)
WINDOWS = ("24h",)
MAX_CUSTOM_ID = 512


class NotARequest(ValueError):
    def __init__(self, *, message: str, code: str, param: str | None = None, custom_id: str | None = None):
        super().__init__(message)
        self.code, self.param, self.custom_id = code, param, custom_id


@dataclass
class Read:
    """An input file read: its good lines' items, prepared, on one model version, and every line's fate."""

    task: Task | None
    items: list[Inputs]
    lines: list[RequestLine]
    rejected: list[Rejected]


def count_lines(content: bytes) -> int:
    return sum(1 for raw in content.splitlines() if raw.strip())


def read_file(content: bytes, endpoint: str, adapter: OpenAIEmbeddings, resolve: Any, prepare: Any,
              max_items: int) -> Read:
    """Each line of an input file checked and prepared; resolve(name) gives a model's task, prepare
    (task, texts) its items (web/pipeline.py's). A 400 (too_many_items) as soon as the good lines
    hold more than max_items texts: a file's cost is bounded before it is all tokenized."""
    read = Read(None, [], [], [])
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        custom_id = None
        try:
            custom_id, body = request_of(raw, endpoint, seen)
            task = read.task or resolve(body.get("model") if isinstance(body.get("model"), str) else "")
            if body.get("model") != task.spec.name:
                raise BadParam(param="model", message=f"one model a batch: this batch's is {task.spec.name}",
                               code="mismatched_model")
            work = adapter.read(task, body)
            items = [inputs for inputs, _ in prepare(task, work.items)]  # an embedder's items keep no context
        except NotARequest as exc:
            read.rejected.append(Rejected(number=number, custom_id=exc.custom_id, code=exc.code, message=str(exc),
                                          param=exc.param))
            continue
        except FunnelError as exc:
            param = getattr(exc, "param", None) or ("model" if exc.status == 404 else None)
            read.rejected.append(Rejected(number=number, custom_id=custom_id, code=exc.code, message=exc.message,
                                          param=param, status=exc.status))
            continue
        if len(read.items) + len(items) > max_items:
            raise BadParam(param="input_file_id", message=f"the file's requests hold more than {max_items} inputs "
                           f"by line {number}; a batch takes {max_items} at most", code="too_many_items")
        read.task = task
        read.lines.append(RequestLine(number=number, custom_id=custom_id, start=len(read.items), count=len(items),
                                      tokens=tokens_of(items), base64=work.kept == "base64"))
        read.items += items
    return read


def request_of(raw: bytes, endpoint: str, seen: set[str]) -> tuple[str, dict]:
    """A line's custom_id and body; NotARequest for a line that is none (it names no custom_id, or a
    used one, or another method or URL)."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise NotARequest(message="the line is not JSON", code="invalid_json_line") from None
    if not isinstance(line, dict):
        raise NotARequest(message="the line must be a JSON object", code="invalid_json_line")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        raise NotARequest(message=f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters",
                          code="invalid_custom_id", param="custom_id")
    if custom_id in seen:
        raise NotARequest(message=f"custom_id {custom_id!r} is an earlier line's: each line's must be its own",
                          code="duplicate_custom_id", param="custom_id", custom_id=custom_id)
    seen.add(custom_id)
    if line.get("method") != "POST":
        raise NotARequest(message="method must be POST", code="invalid_method", param="method", custom_id=custom_id)
    if line.get("url") != endpoint:
        raise NotARequest(message=f"url must be the batch's endpoint, {endpoint}", code="mismatched_url", param="url",
                          custom_id=custom_id)
    body = line.get("body")
    if not isinstance(body, dict):
        raise NotARequest(message="body must be a JSON object", code="invalid_body", param="body", custom_id=custom_id)
    return custom_id, body


# -- what became of each line ------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    line: RequestLine
    replies: list[Reply] | None  # every item's, when each was answered
    error: dict | None           # the first failed item's error
    unanswered: bool


def outcomes(description: Description, pages: Iterable[list[bytes | None]]) -> Iterator[Outcome]:
    """Each good line's fate, in line order, from the job's result pages (job_store.result_pages)."""
    payloads = itertools.chain.from_iterable(pages)
    for line in description.lines:
        replies, error, missing = [], None, False
        for payload in itertools.islice(payloads, line.count):
            if payload is None:
                missing = True
                continue
            try:
                reply = decode_reply(payload)
            except WireError as exc:
                reply = Reply(id="", ok=False, error={"code": "bad_reply", "message": str(exc)})
            if not reply.ok and error is None:
                error = reply.error or {"code": "inference_failed", "message": ""}
            replies.append(reply)
        yield Outcome(line, None if missing or error else replies, error, missing and error is None)


def needs_scan(record: jobs.Record, description: Description) -> bool:
    """Whether counting the lines takes a scan of the results (and the description's lines): a
    final batch of lines of several texts where an item failed or a cancel left some unanswered."""
    return (not description.counts and record.total != description.good
            and record.state in ("done", "failed", "cancelled") and bool(record.failed or record.cancelled))


def counts(record: jobs.Record, description: Description, pages: Any) -> tuple[int, int]:
    """(completed, failed) request lines. Exact from the record alone when each line is one item or no
    item failed; else a scan of the results once the batch is final (`pages()` gives them; the
    description's lines loaded), and, while it runs, the share of items answered."""
    rejected, good = description.refused, description.good
    failed_items, final = record.failed, record.state in ("done", "failed", "cancelled")
    if description.counts:
        return description.counts[0], description.counts[1]
    if record.total == good:  # one item a line
        unanswered = record.total - record.done if record.state == "cancelled" else 0
        return record.done - failed_items, rejected + failed_items + unanswered
    if needs_scan(record, description):
        completed = sum(1 for o in outcomes(description, pages()) if o.replies is not None)
        return completed, rejected + good - completed
    if final:
        return good, rejected
    return (record.done - failed_items) * good // max(1, record.total), rejected + min(failed_items, good)


# -- OpenAI's objects ----------------------------------------------------------------------------

STATUS = {"queued": "in_progress", "running": "in_progress", "done": "completed", "failed": "completed",
          "cancelled": "cancelled"}


def batch_object(record: jobs.Record, description: Description, done: tuple[int, int], ttl_s: int,
                 settled: bool = True) -> dict:
    """The Batch; `settled` False while a cancelled batch's items taken before the cancel still run
    (`cancelling`: its files are written once it is `cancelled`)."""
    status = STATUS[record.state] if settled else "cancelling"
    created = record.created_ms // 1000
    finished = record.finished_ms // 1000 if record.finished_ms else None
    cancelled = description.cancelled_ms // 1000 if description.cancelled_ms else None
    final = status in ("completed", "cancelled")
    return {
        "id": batch_id(record.id), "object": "batch", "endpoint": description.endpoint, "errors": None,
        "model": description.model, "input_file_id": description.input_file_id,
        "completion_window": description.completion_window, "status": status,
        "output_file_id": result_file_id(record.id, OUTPUT) if final and done[0] else None,
        "error_file_id": result_file_id(record.id, ERRORS) if final and done[1] else None,
        "created_at": created, "in_progress_at": created, "expires_at": created + ttl_s,
        "finalizing_at": finished if status == "completed" else None,
        "completed_at": finished if status == "completed" else None, "failed_at": None, "expired_at": None,
        "cancelling_at": cancelled, "cancelled_at": cancelled if status == "cancelled" else None,
        "request_counts": {"total": description.total, "completed": done[0], "failed": done[1]},
        "metadata": description.metadata,
    }


def file_object(made: File, ttl_s: int) -> dict:
    created = made.created_ms // 1000
    return {"id": made.id, "object": "file", "bytes": made.bytes, "created_at": created, "filename": made.filename,
            "purpose": made.purpose, "status": "processed", "expires_at": created + ttl_s, "status_details": None}


def result_file_object(record: jobs.Record, kind: str, size: int, ttl_s: int) -> dict:
    """A batch's output or error file; it lives as long as its job (`ttl_s` after its last progress)."""
    created = (record.finished_ms or record.created_ms) // 1000
    return {"id": result_file_id(record.id, kind), "object": "file", "bytes": size, "created_at": created,
            "filename": f"{BATCH_PREFIX}{record.id}_{kind}.jsonl", "purpose": "batch_output",
            "status": "processed", "expires_at": created + ttl_s, "status_details": None}


def result_lines(record: jobs.Record, description: Description, kind: str,
                 pages: Iterable[list[bytes | None]]) -> Iterator[bytes]:
    """The output file's lines (every answered line, in line order) or the error file's (each
    refused, failed or unanswered line, in line order), one JSON object and a newline each."""
    walked = outcomes(description, pages)
    if kind == OUTPUT:
        for outcome in walked:
            if outcome.replies is not None:
                line = outcome.line
                vectors = [(reply.outputs or {})["embedding"] for reply in outcome.replies]
                body = answer(description.model, vectors, line.base64, line.tokens)
                yield _line(record.id, line.number, line.custom_id, _response(record.id, line.number, 200, body), None)
        return
    failed = ((o.line.number, _failed(record, o)) for o in walked if o.replies is None
              and (not o.unanswered or record.state == "cancelled"))
    refused = ((r.number, _refused(record.id, r)) for r in description.rejected)
    for _, written in heapq.merge(failed, refused, key=lambda pair: pair[0]):
        yield written


def _failed(record: jobs.Record, outcome: Outcome) -> bytes:
    number, custom_id = outcome.line.number, outcome.line.custom_id
    if outcome.error is None:  # a cancel left it unanswered
        return _line(record.id, number, custom_id, None,
                     {"code": "batch_cancelled", "message": "the batch was cancelled before this request ran"})
    code = outcome.error.get("code", "inference_failed")
    status = reply_status(outcome.error)
    return _line(record.id, number, custom_id,
                 _response(record.id, number, status, error_body(status, code, outcome.error.get("message", ""),
                                                                 None)), None)


def _refused(job_id: str, rejected: Rejected) -> bytes:
    if not rejected.status:  # not a request at all
        return _line(job_id, rejected.number, rejected.custom_id, None,
                     {"code": rejected.code, "message": f"line {rejected.number}: {rejected.message}"})
    body = error_body(rejected.status, rejected.code, rejected.message, rejected.param)
    return _line(job_id, rejected.number, rejected.custom_id, _response(job_id, rejected.number, rejected.status, body),
                 None)


def _response(job_id: str, number: int, status: int, body: dict) -> dict:
    return {"status_code": status, "request_id": f"{job_id}-{number}", "body": body}


def _line(job_id: str, number: int, custom_id: str | None, response: dict | None, error: dict | None) -> bytes:
    return orjson.dumps({"id": f"batch_req_{job_id}_{number}", "custom_id": custom_id, "response": response,
                         "error": error}, option=OPTIONS) + b"\n"

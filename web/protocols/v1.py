"""POST /v1/models/<name>[/versions/<n>]/predict: Funnel's own JSON (or image upload) in, JSON out.

    image  multipart field `file`, or a raw image/* body      -> {"model", "predictions", "meta"}
    text   {"text": "..."} or {"texts": [...]}                 -> {"model", "embedding", "meta"}
    json   {"input": ...} or {"inputs": [...]}                 or {"model", "results": [...], "meta": [...]}
    file   multipart `file` fields (one per item), or a raw body of a content type the task declares

One item sent alone is answered at the top level; several, as "results" in
request order. Errors are {"error": {"code", "message"}} (web/errors.py).
With `Accept: text/event-stream` (or `application/x-ndjson`) the items are
answered as their jobs are, an event each, then a last event (`Events`).
A predict that asks for a job (`Prefer: respond-async`, `Webhook-URL`) is the
job routes' (routes/jobs.py): the front sends it there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import orjson
from werkzeug.wrappers import Request

from funnel.common.contracts.wire import Reply
from funnel.common.observability import logs
from funnel.common.tasks import Task
from funnel.web import errors
from funnel.web.jsonio import OPTIONS
from funnel.web.pipeline import Answered, Rendered, Work
from funnel.web.protocols.inputs import read_items

log = logging.getLogger("funnel.web")

PATH = re.compile(r"/v1/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/predict")


@dataclass(frozen=True)
class Form:
    """How a /v1 request sent its items, kept to answer in kind (the adapter's context)."""

    single: bool  # one item as such ({"text": ...}, one image): answered as one, not as a list


class V1:
    def __init__(self, max_items: int):
        self.max_items = max_items

    def parse(self, task: Task, request: Request) -> Work[Form]:
        items, single = read_items(task, request, self.max_items)
        return Work(items, Form(single))

    def render(self, task: Task, work: Work[Form], answered: Answered) -> tuple[bytes, list[tuple[str, str]]]:
        name, replies = task.spec.name, answered.replies
        results = [reply.outputs or {} for reply in replies]  # numpy arrays are written by orjson
        request_id = logs.REQUEST_ID.get()
        by_job: dict[tuple[str, str], dict] = {}  # the items of one job share its reply's figures: one meta a job
        meta = []
        for r, cache in zip(replies, answered.cache or [""] * len(replies), strict=True):
            shared = by_job.get((r.id, cache))
            if shared is None:
                shared = by_job[r.id, cache] = meta_of(r, request_id, answered.lane, cache)
            meta.append(shared)
        if work.kept.single:
            body = {"model": name, **results[0], "meta": meta[0]}
        else:
            body = {"model": name, "results": results, "meta": meta}
        return orjson.dumps(body, option=OPTIONS), []

    def render_error(self, error: Exception, request: Request) -> Rendered:
        if not errors.expected(error):
            log.exception("predict failed", exc_info=error)
        status, body, headers = errors.render(error, request)
        return status, orjson.dumps(body), headers


def meta_of(reply: Reply, request_id: str, lane: str, cache: str = "") -> dict:
    """An item's "meta": what its job's reply says of how it was run (the same for every item of the job)."""
    return {"worker": reply.worker, "model_version": reply.version, "batch_size": reply.batch_size,
            "queue_ms": round(reply.queue_ms, 2), "infer_ms": round(reply.infer_ms, 2), "request_id": request_id,
            "priority": lane, **({"cache": cache} if cache else {})}


# -- streamed answers ------------------------------------------------------------------------------

STREAMS = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}


def stream_kind(accept: str) -> str | None:
    """The stream a request's Accept asks for (Server-Sent Events or JSON lines), or None: one JSON answer."""
    asked = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return next((STREAMS[kind] for kind in asked if kind in STREAMS), None)


class Events:
    """One streamed answer: an event per item as its job is answered, in whatever order, then a last one.

    An item's event is what the JSON answer gives it in "results", with its "index" and its "meta"; an
    item whose job failed has {"index", "error"} with the code the JSON answer would have. The last
    event is {"done": true, "items": n} (SSE `event: done`), or the request's own error, as the JSON
    answer's body, with its "status" (SSE `event: error`).
    """

    def __init__(self, *, kind: str, model: str):
        self.kind, self.model = kind, model
        self.content_type = "text/event-stream" if kind == "sse" else "application/x-ndjson"
        self.request_id = logs.REQUEST_ID.get()

    def items(self, first: int, count: int, reply: Reply, lane: str) -> bytes:
        """The events of one job's items, from its reply."""
        if not reply.ok:
            error = {"code": (reply.error or {}).get("code", "inference_failed"),
                     "message": (reply.error or {}).get("message", "")}
            return b"".join(self._event("item", first + i, {"index": first + i, "error": error})
                            for i in range(count))
        meta = meta_of(reply, self.request_id, lane)
        return b"".join(self._event("item", first + i, {"index": first + i, **(item.outputs or {}), "meta": meta})
                        for i, item in enumerate(reply.each()))

    def whole(self, body: bytes) -> bytes:
        """The events of every item of a whole JSON answer (a cached model's, answered at once)."""
        answer = orjson.loads(body)
        if "results" not in answer:  # one item, answered at the top level
            return self._event("item", 0, {"index": 0, **{k: v for k, v in answer.items() if k != "model"}})
        return b"".join(self._event("item", i, {"index": i, **result, "meta": meta})
                        for i, (result, meta) in enumerate(zip(answer["results"], answer["meta"])))

    @staticmethod
    def count(body: bytes) -> int:
        answer = orjson.loads(body)
        return len(answer["results"]) if "results" in answer else 1

    def end(self, status: int, body: bytes, items: int) -> bytes:
        if status == 200:
            return self._event("done", None, {"done": True, "model": self.model, "items": items})
        return self._event("error", None, {**orjson.loads(body), "status": status})

    def _event(self, name: str, index: int | None, data: dict) -> bytes:
        line = orjson.dumps(data, option=OPTIONS)
        if self.kind == "ndjson":
            return line + b"\n"
        return (f"id: {index}\n" if index is not None else "").encode() + f"event: {name}\ndata: ".encode() \
            + line + b"\n\n"

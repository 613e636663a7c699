"""POST /v1/models/<name>[/versions/<n>]/predict: Funnel's own JSON (or image upload) in, JSON out.

    image  multipart field `file`, or a raw image/* body      -> {"model", "predictions", "meta"}
    text   {"text": "..."} or {"texts": [...]}                 -> {"model", "embedding", "meta"}
    json   {"input": ...} or {"inputs": [...]}                 or {"model", "results": [...], "meta": [...]}
    file   multipart `file` fields (one per item), or a raw body of a content type the task declares

One item sent alone is answered at the top level; several, as "results" in
request order. Errors are {"error": {"code", "message"}} (web/errors.py).
A predict that asks for a job (`Prefer: respond-async`, `Webhook-URL`) is the
job routes' (routes/jobs.py): the front sends it there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import orjson
from werkzeug.wrappers import Request

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
                shared = by_job[r.id, cache] = {
                    "worker": r.worker, "model_version": r.version, "batch_size": r.batch_size,
                    "queue_ms": round(r.queue_ms, 2), "infer_ms": round(r.infer_ms, 2), "request_id": request_id,
                    "priority": answered.lane, **({"cache": cache} if cache else {})}
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

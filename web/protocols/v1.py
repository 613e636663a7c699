"""POST /v1/models/<name>[/versions/<n>]/predict: Funnel's own JSON (or image upload) in, JSON out.

    image  multipart field `file`, or a raw image/* body      -> {"model", "predictions", "meta"}
    text   {"text": "..."} or {"texts": [...]}                 -> {"model", "embedding", "meta"}
    json   {"input": ...} or {"inputs": [...]}                 or {"model", "results": [...], "meta": [...]}

One item sent alone is answered at the top level; several, as "results" in
request order. Errors are {"error": {"code", "message"}} (web/errors.py).
A predict that asks for a job (`Prefer: respond-async`, `Webhook-URL`) is the
job routes' (protocols/jobs.py): the front sends it there.
"""

from __future__ import annotations

import logging
import re

import orjson
from werkzeug.wrappers import Request

from funnel.common import logs
from funnel.common.tasks import Task
from funnel.common.wire import Reply
from funnel.web import errors
from funnel.web.jsonio import OPTIONS
from funnel.web.pipeline import Rendered, Work
from funnel.web.protocols.inputs import read_items

log = logging.getLogger("funnel.web")

PATH = re.compile(r"/v1/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/predict")


class V1:
    def __init__(self, max_items: int):
        self.max_items = max_items

    def parse(self, task: Task, request: Request) -> Work:
        items, single = read_items(task.input_kind, request, self.max_items)
        return Work(items, context={"single": single})

    def render(self, task: Task, work: Work, replies: list[Reply]) -> tuple[bytes, list[tuple[str, str]]]:
        name = task.spec.name
        results = [reply.outputs or {} for reply in replies]  # numpy arrays are written by orjson
        request_id = logs.REQUEST_ID.get()
        by_job: dict[str, dict] = {}  # the items of one job share its reply's figures: one meta a job
        meta = []
        for r in replies:
            shared = by_job.get(r.id)
            if shared is None:
                shared = by_job[r.id] = {
                    "worker": r.worker, "model_version": r.version, "batch_size": r.batch_size,
                    "queue_ms": round(r.queue_ms, 2), "infer_ms": round(r.infer_ms, 2), "request_id": request_id,
                    "priority": work.priority}
            meta.append(shared)
        if work.context["single"]:
            body = {"model": name, **results[0], "meta": meta[0]}
        else:
            body = {"model": name, "results": results, "meta": meta}
        return orjson.dumps(body, option=OPTIONS), []

    def render_error(self, error: Exception, request: Request) -> Rendered:
        if not errors.expected(error):
            log.exception("predict failed", exc_info=error)
        status, body, headers = errors.render(error, request)
        return status, orjson.dumps(body), headers

"""Async and bulk jobs over HTTP: submit now, collect later (common/jobs.py has the record).

    POST   /v1/models/<name>/jobs   {"texts": [...]} (or {"inputs": [...]}), up to FUNNEL_MAX_JOB_ITEMS;
                                    an image model: multipart, one `file` field per image
    POST   /v1/models/<name>/predict with `Prefer: respond-async`: the same request, as a job
    GET    /v1/jobs/<id>?offset=0&limit=100   state, progress, a page of results
    GET    /v1/jobs/<id>/results?offset=0     every result, in input order, as JSON Lines
    DELETE /v1/jobs/<id>                      cancel: items not yet taken never run

A submit answers 202 with the job's status and `Location: /v1/jobs/<id>`
once the record and every item are in Redis (one MULTI/EXEC): a web process
that dies after its 202 loses nothing. `Idempotency-Key` makes a retried
submit answer the job the first one created (422 if the body differs).
Bulk items skip interactive load shedding; FUNNEL_MAX_BULK_QUEUE bounds them.
A submit may name a webhook (the body's "webhook", or a `Webhook-URL` header),
POSTed the job's status when it is final (common/webhooks.py, worker/webhook.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson
import redis
from flask import Blueprint, Flask, Response, jsonify, request

from funnel.common import jobs, webhooks
from funnel.common.errors import BadInput, FunnelError, NotFound, Overloaded
from funnel.common.keys import Keys
from funnel.common.tasks import Task
from funnel.common.wire import Job, WireError, decode_reply, encode_job, now_ms
from funnel.web.inputs import read_images, read_items, read_json_items, served
from funnel.web.jsonio import OPTIONS
from funnel.web.settings import WebSettings

PUSH_CHUNK = 1000             # items per LPUSH inside the submit's transaction
DEFAULT_PAGE, MAX_PAGE = 100, 1000
ITEM_DEADLINE_MS = 365 * 86_400_000  # bulk items have no deadline of their own: the job's TTL bounds them
MAX_IDEMPOTENCY_KEY = 255
STREAM_CHUNK = 1000          # results per HMGET while streaming JSON Lines: memory stays bounded
WEBHOOK_HEADER = "Webhook-URL"

# KEYS: the job record, due webhooks. ARGV: now (ms), job id. Cancels a job that is not finished
# (and makes its webhook due); 0 when there is no such job.
_CANCEL = webhooks.ENQUEUE_LUA + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local r = redis.call('HMGET', KEYS[1], 'done', 'total')
if tonumber(r[1]) < tonumber(r[2]) then
  redis.call('HSET', KEYS[1], 'state', 'cancelled')
  webhook_due(KEYS[1], KEYS[2], ARGV[2], ARGV[1])
end
return 1
"""


class Gone(FunnelError):
    status, code = 410, "job_expired"


class OnCluster(FunnelError):
    """A job's record, its results and the due webhooks are written together by one script, and
    the webhook deliverer reads job records by name: a cluster refuses both across slots
    (docs/redis.md)."""

    status, code = 501, "unsupported_on_cluster"

    def __init__(self):
        super().__init__("async and bulk jobs are not available on a Redis Cluster deployment; send "
                         "interactive predicts, or use a single Redis (or Sentinel)")


class Conflict(FunnelError):
    status, code = 422, "idempotency_key_reused"


def wants_async(prefer: str) -> bool:
    """Whether a Prefer header (RFC 7240) asks for respond-async."""
    return any(part.split(";")[0].strip().lower() == "respond-async" for part in prefer.split(","))


class JobsApi:
    def __init__(self, models: dict[str, Task], client: redis.Redis, keys: Keys, settings: WebSettings):
        self.models, self.client, self.keys, self.settings = models, client, keys, settings
        self._cancel = client.register_script(_CANCEL)

    # -- submit ----------------------------------------------------------------

    def submit(self, name: str, items: list[Any], webhook: str | None = None):
        if self.keys.cluster:  # an async predict comes here without the blueprint's hook
            raise OnCluster()
        task = self.models[name]
        idempotency = request.headers.get("Idempotency-Key")
        if idempotency is not None and not 0 < len(idempotency) <= MAX_IDEMPOTENCY_KEY:
            raise BadInput(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                           code="bad_idempotency_key")
        if webhook is not None:
            self.check_webhook(webhook)
        body = request.get_data()
        if webhook is not None:  # part of what a retried submit must repeat, wherever it was given
            body += f"\n{WEBHOOK_HEADER}: {webhook}".encode()
        body_sha = hashlib.sha256(body).hexdigest()
        idem_key = (self.keys.idempotency(name, hashlib.sha256(idempotency.encode()).hexdigest()[:48])
                    if idempotency is not None else None)
        if idem_key:
            existing = self._replay(idem_key, body_sha)
            if existing is not None:
                return existing
        created = now_ms()
        job_id = jobs.new_job_id(created)
        ttl_ms = self.settings.job_ttl_s * 1000
        results = self.keys.job_results(job_id)
        # Encoded one by one, so only the wire bytes of every item are held, not their tensors too.
        payloads = [encode_job(Job(id=jobs.item_id(job_id, i), model=name, inputs=item, reply_to=results,
                                   deadline=created + ITEM_DEADLINE_MS, enqueued=created))
                    for i, item in enumerate(preprocess(task, items))]
        bulk = self.keys.bulk(name)
        queued = self.client.llen(bulk)
        if queued + len(payloads) > self.settings.max_bulk_queue:
            raise Overloaded(f"the {name} bulk queue holds {queued} items; {len(payloads)} more would pass "
                             f"its limit of {self.settings.max_bulk_queue}; retry later", retry_after=30)
        record = {"model": name, "total": len(payloads), "done": 0, "failed": 0, "duplicates": 0,
                  "created_ms": created, "finished_ms": 0, "ttl_ms": ttl_ms, "state": "active",
                  "body_sha256": body_sha, **({"webhook_url": webhook} if webhook else {})}
        replay = self._create(job_id, record, payloads, bulk, idem_key, body_sha)
        if replay is not None:
            return replay
        return self._accepted(jobs.Record.parse(job_id, {k: str(v) for k, v in record.items()}))

    def _create(self, job_id: str, record: dict, payloads: list[bytes], bulk: str, idem_key: str | None,
                body_sha: str):
        """Record and items in one transaction; the other submit's answer if one with the same
        Idempotency-Key won the race (WATCH), else None."""
        ttl_ms = record["ttl_ms"]
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    if idem_key:
                        pipe.watch(idem_key)
                        replay = self._replay(idem_key, body_sha, pipe)
                        if replay is not None:  # a concurrent submit with the same key won
                            return replay
                    pipe.multi()
                    pipe.hset(self.keys.job(job_id), mapping=record)
                    pipe.pexpire(self.keys.job(job_id), ttl_ms)
                    for start in range(0, len(payloads), PUSH_CHUNK):
                        pipe.lpush(bulk, *payloads[start:start + PUSH_CHUNK])
                    if idem_key:
                        pipe.set(idem_key, job_id, px=ttl_ms)
                    pipe.execute()
                    return None
                except redis.WatchError:
                    continue

    def check_webhook(self, url: str) -> None:
        """400 unless webhooks are on and this URL may be delivered to (common/webhooks.py)."""
        if not self.settings.webhook_secret:
            raise BadInput("this server sends no webhooks (FUNNEL_WEBHOOK_SECRET is not set)",
                           code="webhooks_disabled")
        try:
            webhooks.check(url, self.settings.webhook_allow_hosts)
        except webhooks.Refused as exc:
            raise BadInput(str(exc), code="bad_webhook") from None

    def _replay(self, idem_key: str, body_sha: str, conn: Any = None):
        """The answer to a submit whose Idempotency-Key made a job that still exists, else None."""
        conn = conn if conn is not None else self.client
        job_id = conn.get(idem_key)
        if job_id is None:
            return None
        job_id = job_id.decode()
        raw = conn.hgetall(self.keys.job(job_id)) if jobs.is_job_id(job_id) else {}
        if not raw:
            return None  # its job expired: this key makes a new one
        record = jobs.Record.parse(job_id, raw)
        if record.body_sha256 != body_sha:
            raise Conflict("this Idempotency-Key was used with a different body")
        response = self._accepted(record)
        response.headers["Idempotent-Replayed"] = "true"
        return response

    def _accepted(self, record: jobs.Record):
        response = jsonify(self.describe(record))
        response.status_code = 202
        response.headers["Location"] = f"/v1/jobs/{record.id}"
        return response

    # -- status, results, cancel -------------------------------------------------

    def describe(self, record: jobs.Record, page: tuple[int, int, list] | None = None) -> dict:
        body = record.status()
        if page is not None:
            offset, limit, payloads = page
            body["results"] = [self._result(p) for p in payloads]
            body["offset"], body["limit"] = offset, limit
            end = offset + len(payloads)
            body["next_offset"] = end if end < record.total else None
        return body

    @staticmethod
    def _result(payload: bytes | None) -> dict | None:
        if payload is None:
            return None  # not answered yet
        try:
            reply = decode_reply(payload)
        except WireError as exc:
            return {"error": {"code": "bad_reply", "message": str(exc)}}
        if reply.ok:
            return reply.outputs or {}
        return {"error": reply.error}

    def _load(self, job_id: str, offset: int = 0, limit: int = 0) -> tuple[jobs.Record, list]:
        if not jobs.is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}", code="unknown_job")
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.keys.job(job_id))
        if limit:
            pipe.hmget(self.keys.job_results(job_id), list(range(offset, offset + limit)))
        raw, *rest = pipe.execute()
        if not raw:
            if jobs.created_ms_of(job_id) + self.settings.job_ttl_s * 1000 <= now_ms():
                raise Gone(f"job {job_id} has expired: jobs are kept {self.settings.job_ttl_s} s "
                           f"after their last progress")
            raise NotFound(f"no job {job_id!r}", code="unknown_job")
        record = jobs.Record.parse(job_id, raw)
        payloads = rest[0][:max(0, record.total - offset)] if rest else []
        return record, payloads

    def status(self, job_id: str):
        offset = self._int_arg("offset", 0, 0, None)
        limit = self._int_arg("limit", DEFAULT_PAGE, 0, MAX_PAGE)
        record, payloads = self._load(job_id, offset, limit)
        return jsonify(self.describe(record, (offset, limit, payloads)))

    def stream(self, job_id: str) -> Response:
        """Every result from offset on, one JSON value a line, in input order (null: not answered
        yet), read STREAM_CHUNK at a time: a 100,000-item job never sits in memory whole."""
        offset = self._int_arg("offset", 0, 0, None)
        record, _ = self._load(job_id)
        key = self.keys.job_results(job_id)

        def lines() -> Iterator[bytes]:
            for start in range(offset, record.total, STREAM_CHUNK):
                payloads: list = self.client.hmget(key, list(range(start, min(start + STREAM_CHUNK, record.total))))
                yield b"".join(orjson.dumps(self._result(p), option=OPTIONS) + b"\n" for p in payloads)

        response = Response(lines(), mimetype="application/x-ndjson")
        response.headers["Funnel-Job-State"] = record.state  # as the stream began
        return response

    def cancel(self, job_id: str):
        if not jobs.is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}", code="unknown_job")
        self._cancel(keys=[self.keys.job(job_id), self.keys.webhooks_due()], args=[now_ms(), job_id])
        record, _ = self._load(job_id)
        return jsonify(self.describe(record))

    @staticmethod
    def _int_arg(name: str, default: int, low: int, high: int | None) -> int:
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


def install(app: Flask, models: dict[str, Task], client: redis.Redis, keys: Keys, settings: WebSettings) -> None:
    """The jobs routes, and `Prefer: respond-async` on the predict route (after the API key check)."""
    api = JobsApi(models, client, keys, settings)
    blueprint = Blueprint("jobs", __name__)

    @blueprint.post("/v1/models/<name>/jobs")
    def submit(name: str):
        task = served(models, name)
        if task.input_kind == "image":
            request.get_data()  # cached before the multipart parse consumes it: the Idempotency-Key's check
            items = read_images(request, min(settings.max_job_items, settings.max_job_images))
            return api.submit(name, items, webhook_of(request.form.get("webhook")))
        one, many = ("text", "texts") if task.input_kind == "text" else ("input", "inputs")
        items, _ = read_json_items(request, one, many, settings.max_job_items)
        if task.input_kind == "text" and not all(isinstance(t, str) for t in items):
            raise BadInput("every text must be a string", code="bad_json")
        return api.submit(name, items, webhook_of((request.get_json(silent=True) or {}).get("webhook")))

    @blueprint.get("/v1/jobs/<job_id>")
    def status(job_id: str):
        return api.status(job_id)

    @blueprint.get("/v1/jobs/<job_id>/results")
    def results(job_id: str):
        return api.stream(job_id)

    @blueprint.delete("/v1/jobs/<job_id>")
    def cancel(job_id: str):
        return api.cancel(job_id)

    refuse_on_cluster(blueprint, keys)
    app.register_blueprint(blueprint)

    @app.before_request
    def respond_async():
        if request.endpoint != "predict":
            return None
        if not wants_async(request.headers.get("Prefer", "")):
            if WEBHOOK_HEADER in request.headers:  # a webhook only ever follows a job
                raise BadInput(f"{WEBHOOK_HEADER} needs 'Prefer: respond-async'", code="bad_webhook")
            return None
        name = (request.view_args or {}).get("name", "")
        task = served(models, name)
        request.get_data()  # cached before a multipart parse consumes it: the Idempotency-Key's body check
        items, _ = read_items(task.input_kind, request, settings.max_items)
        response = api.submit(name, items, webhook_of(None))
        response.headers["Preference-Applied"] = "respond-async"
        return response


def refuse_on_cluster(blueprint: Blueprint, keys: Keys) -> None:
    """On a Redis Cluster every jobs route answers 501 (OnCluster), after the API key check."""
    if keys.cluster:
        @blueprint.before_request
        def unsupported_on_cluster():
            raise OnCluster()


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


def preprocess(task: Task, items: list[Any]) -> Iterator[dict]:
    """Each item's tensors, in turn; a bad item fails the whole submit, named by its index."""
    for i, item in enumerate(items):
        try:
            yield task.preprocess(item)
        except FunnelError as exc:
            if len(items) > 1:
                exc.message = f"item {i}: {exc.message}"
                exc.args = (exc.message,)
            raise

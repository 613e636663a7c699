"""The one path of a request through the web tier, whatever protocol it came in.

    front (transport/front.py)  reads the body, checks the API key, picks the adapter
                 (or the gRPC service, web/grpc/service.py, its message read: `infer`, steps 1 to 6)
    1 resolve    the served model's task, by name (404 before a name can become a key), and its
                 version: the one the URL pins, else the traffic policy's pick (queueing/versions.py)
    2 parse      the adapter (protocols/) reads the request's items
    3 prepare    each item preprocessed, or checked when the client sent the model's own tensors
    4 admit      503 at once with no live worker; the deadline from X-Request-Timeout
    5 enqueue    one push script per request (queueing/outbox.py, one round trip a loop turn)
                 refuses a full queue or a predicted wait past the deadline, else LPUSHes
    6 await      the replies, through this process's inbox (queueing/inbox.py), until the deadline
    7 render     the adapter answers the replies, or the error, in its protocol's shape

A bulk job (`submit_job`, from protocols/jobs.py's routes) takes steps 1 and
3, then its own admission (the bulk queue's room) and the job store instead of
the queue: its items are answered into the job's results, not awaited.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
from werkzeug.wrappers import Request

from funnel.common import job_submit, jobs, lua_scripts
from funnel.common.errors import REPLY_STATUS, FunnelError, NotFound, Overloaded, Unavailable
from funnel.common.job_store import JobStore
from funnel.common.keys import Keys
from funnel.common.tasks import Inputs, Task
from funnel.common.wire import Job, Reply, encode_job, now_ms
from funnel.web import metrics
from funnel.web.catalog import Catalog
from funnel.web.queueing import push_script
from funnel.web.queueing.inbox import Inbox
from funnel.web.queueing.outbox import Outbox
from funnel.web.queueing.shedding import (
    NO_WORKER_RETRY_AFTER_S,
    Calibration,
    Capacity,
    WorkerView,
    request_timeout,
    retry_after_s,
)
from funnel.web.queueing.versions import Versions
from funnel.web.settings import WebSettings

Rendered = tuple[int, bytes, list[tuple[str, str]]]  # status, body, extra headers

log = logging.getLogger("funnel.web.jobs")


@dataclass
class Work:
    """What an adapter parsed from a request: the items to run and how to run them."""

    items: list[Any]
    ready: bool = False  # the items are the model's own tensors, checked rather than preprocessed
    raw: bool = False  # the replies carry the model's output rows, not the task's results
    context: dict[str, Any] = field(default_factory=dict)  # what the adapter needs again to render
    prepared: list[Inputs] = field(default_factory=list)  # the items' tensors, for adapters that count them


class Parser(Protocol):
    """What the pipeline asks of a protocol before it queues: the request's items (the gRPC
    service's adapter reads a protobuf message, the others a werkzeug Request)."""

    def parse(self, task: Task, request: Any) -> Work:
        """The request's items; a FunnelError for a request the protocol cannot read."""
        ...


class Adapter(Parser, Protocol):
    """A protocol's two ends of a predict-like HTTP route (protocols/v1.py, v2.py, openai.py)."""

    def render(self, task: Task, work: Work, replies: list[Reply]) -> tuple[bytes, list[tuple[str, str]]]:
        """A 200's body and headers, from the replies in item order."""
        ...

    def render_error(self, error: Exception, request: Request) -> Rendered:
        """Any failure, in the protocol's error shape."""
        ...


class Pipeline:
    def __init__(self, catalog: Catalog, client: redis.Redis, keys: Keys, settings: WebSettings):
        self.catalog, self.client, self.keys, self.settings = catalog, client, keys, settings
        self.inbox = Inbox(client, keys, on_unclaimed=metrics.UNCLAIMED.inc)
        self.outbox = Outbox(client, lua_scripts.register(client, "push"), cluster=keys.cluster)
        self.workers = WorkerView(client, keys)
        self.versions = Versions(client, keys, self.workers)
        self.calibration = Calibration()
        self.jobs = JobStore(client, keys, settings.job_ttl_s)
        self.job_limits = job_submit.SubmitLimits.of(settings)

    async def respond(self, adapter: Adapter, request: Request, name: str, version: str | None = None) -> Rendered:
        """A predict-like request, whole: its status, body and headers, an error included."""
        try:
            cap_s = self.settings.request_timeout_s
            task, work, replies = await self.infer(adapter, request, name, version,
                                                   lambda: request_timeout(request.headers, cap_s))
            body, headers = adapter.render(task, work, replies)
            return 200, body, headers
        except Exception as exc:
            return adapter.render_error(exc, request)

    async def infer(self, parser: Parser, request: Any, name: str, version: str | None,
                    timeout_s: Callable[[], float]) -> tuple[Task, Work, list[Reply]]:
        """Steps 1 to 6, whatever protocol renders their outcome: the task, the parsed work (its
        items' tensors in `prepared`) and the replies in item order. timeout_s is asked once the
        request is read, so that a bad model or body is told before a bad deadline."""
        task = self.resolve(name, version)
        work = parser.parse(task, request)
        work.prepared = list(self.prepare(task, work.items, work.ready))
        replies = await self.run(name, task.spec.version, work.prepared, timeout_s(), work.raw)
        return task, work, replies

    def submit_job(self, name: str, items: list[Any], idempotency_key: str | None, webhook: str | None,
                   body: bytes, caller: jobs.Caller) -> tuple[jobs.Record, bool]:
        """A bulk (or async) job of these items, owned by the caller (the request's API key, or
        anyone where none are set): its record, and whether an earlier submit by the same caller
        with this Idempotency-Key made it (`body`, the raw request, is what a retry must repeat).

        Resolved and prepared as a predict; then admitted by the bulk queue's room
        (FUNNEL_MAX_BULK_QUEUE, 503) instead of the predicted wait, and created in the job
        store instead of queued and awaited: its items are answered into the job's results.
        """
        task = self.resolve(name)
        self.jobs.usable()
        job_submit.check(idempotency_key, webhook, self.job_limits)
        body_sha = job_submit.fingerprint(body, webhook)
        if idempotency_key is not None:  # before any preprocessing: a retry costs a lookup only
            existing = self.jobs.replay(name, idempotency_key, body_sha, caller)
            if existing is not None:
                return existing, True
        created = now_ms()
        job_id = jobs.new_job_id(created)
        # Encoded item by item: only the wire bytes of every item are held, not their tensors too.
        version = task.spec.version
        payloads = self.jobs.item_payloads(job_id, name, created, self.prepare(task, items), version)
        self.jobs.check_room(name, len(payloads), self.settings.max_bulk_queue, version)
        record, replayed = self.jobs.create(job_id, name, created, payloads, body_sha, webhook, idempotency_key,
                                            version, caller=caller)
        if not replayed:
            metrics.job_submitted(name, caller.label)
            log.info("job %s: %d items of %s version %d for %s", record.id, record.total, name, version,
                     caller.label or "anyone")
        return record, replayed

    # -- 1 resolve, 3 prepare: every route's, bulk jobs' too ----------------------------------

    def resolve(self, name: str, version: str | None = None) -> Task:
        """The task of the model version a request goes to (its spec names the version): the one
        the URL pins, else the traffic policy's pick; 404 for any other name or version."""
        versions = self.catalog.versions(name)
        if not versions:
            raise NotFound(f"no model named {name!r}; served: {', '.join(self.catalog.names())}",
                           code="unknown_model")
        if version is None:
            return versions[self.versions.choose(name, versions)]
        task = versions.get(int(version)) if version.isdigit() else None
        if task is None:
            raise NotFound(f"{name} has no version {version!r}; it has {', '.join(map(str, sorted(versions)))}",
                           code="unknown_version")
        return task

    def prepare(self, task: Task, items: list[Any], ready: bool = False) -> Iterator[Inputs]:
        """Each item's tensors in turn, as the worker takes them; a bad item fails the request,
        named by its index."""
        for i, item in enumerate(items):
            try:
                if ready:
                    task.check(item)
                yield item if ready else task.preprocess(item)
            except FunnelError as exc:
                if len(items) > 1:
                    exc.message = f"item {i}: {exc.message}"
                    exc.args = (exc.message,)
                raise

    # -- 4 admit, 5 enqueue, 6 await -----------------------------------------------------------

    async def run(self, model: str, version: int, inputs: list[Inputs], timeout_s: float,
                  raw: bool = False) -> list[Reply]:
        """One job per input, queued on the model version's queue, and their replies in input order;
        a failed reply raised.

        503 at once when no live worker serves the model (unless held), when its queue
        is at FUNNEL_MAX_QUEUE, or when the predicted wait is past timeout_s; 504 at the
        deadline.
        """
        capacity = self._capacity(model, version)
        deadline = now_ms() + int(timeout_s * 1000)
        ids = [os.urandom(16).hex() for _ in inputs]  # uuid4's randomness, a third of its CPU
        waiter = self.inbox.expect(model, ids)  # before the push: no reply can come unclaimed
        reply_to = self.inbox.key(model)
        jobs = [encode_job(Job(id=job_id, model=model, inputs=item, reply_to=reply_to, deadline=deadline, raw=raw,
                               version=version)) for job_id, item in zip(ids, inputs)]
        estimate = self.settings.shed and capacity.known
        calibration = self.calibration.factor(model)
        keys = push_script.keys_of(self.keys, model, version, push_script.UNLIMITED,
                                   capacity.workers if estimate else ())
        args = push_script.args_of(self.settings.max_queue, capacity.script_args(calibration) if estimate else None,
                                   timeout_s, None, now_ms(), ids[0], deadline, jobs)
        ahead, pushed_ms = -1, 0
        try:
            outcome, count, *rest = await self.outbox.push(keys, args)
            self._admitted(model, outcome, count, capacity, calibration, timeout_s, len(jobs))
            ahead, pushed_ms = (rest[0] if rest else -1), now_ms()
            replies = await self.inbox.collect(waiter, ids, deadline)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        finally:
            self.inbox.forget(ids)
            if ahead >= 0:  # answered or timed out: either way, how late against the prediction
                self.calibration.observe(model, capacity.wait_s(ahead, len(jobs)), (now_ms() - pushed_ms) / 1000)
        metrics.replied(model, replies)
        for i, reply in enumerate(replies):
            if not reply.ok:
                raise reply_error(reply, i, len(replies))
        return replies

    def _capacity(self, model: str, version: int) -> Capacity:
        """The model version's live workers (cached per process); 503 at once when it has none, unless
        held."""
        settings = self.settings
        if not settings.shed and settings.hold_without_workers:
            return Capacity(())  # nothing to predict with, nothing to refuse: no registry read
        try:
            capacity = self.workers.capacity(model, version)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        if not capacity.workers and not settings.hold_without_workers \
                and not self.workers.recently_served(model, version):
            raise Unavailable(f"no live worker serves {model} version {version}; retry when one has started",
                              code="no_worker", retry_after=NO_WORKER_RETRY_AFTER_S)
        return capacity

    @staticmethod
    def _admitted(model: str, outcome: int, count: int, capacity: Capacity, calibration: float,
                  timeout_s: float, n: int) -> None:
        """The push script's verdict: 503 if it turned the request away (a full queue, too long a wait)."""
        if outcome == 0:
            raise Overloaded(f"the {model} queue is full ({count} jobs); retry shortly",
                             retry_after=retry_after_s(capacity.wait_s(count, 0, calibration))
                             if capacity.known else 1)
        if outcome < 0:
            wait_s = capacity.wait_s(count, n, calibration)
            raise Overloaded(f"the {model} queue would answer in about {wait_s:.1f} s, past this "
                             f"request's deadline of {timeout_s:g} s; retry later",
                             retry_after=retry_after_s(wait_s))


def reply_error(reply: Reply, index: int, count: int) -> FunnelError:
    """A worker's error reply as the client's error: its code, and which item when there are several."""
    error = reply.error or {}
    code, message = error.get("code", "inference_failed"), error.get("message", "")
    if count > 1:
        message = f"item {index}: {message}"
    return FunnelError(message, code=code, status=REPLY_STATUS.get(code, 500))

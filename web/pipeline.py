"""The one path of a request through the web tier, whatever protocol it came in.

    front (transport/front.py)  reads the body, knows the API key and the request id, picks the adapter
                 (or the gRPC service, web/grpc/service.py, its message read: `infer`)
    1 resolve    the served model's task, by name (404 before a name can become a key), and its
                 version: the one the URL pins, else the traffic policy's pick (queueing/versions.py)
    2 parse      the adapter (protocols/) reads the request's items
    3 prepare    each item preprocessed, or checked when the client sent the model's own tensors;
                 what preprocess learned of it (its context) checked to travel beside it (a cached
                 model's repeated items as this process prepared them lately: recently_prepared.py)
    4 admit      503 at once with no live worker (a cached model's known items are still answered,
                 step 5); the deadline from X-Request-Timeout; the
                 priority lane asked for (X-Priority, or the protocol's own parameter), at most
                 the key's highest (queueing/admission.py decides who is served, and in which lane)
    5 enqueue    the items, as one `Inference` (`run`), in one job (one per batch when more than a
                 worker's batch), in one push script per request (queueing/outbox.py, one round
                 trip a loop turn), which refuses a key past its limits (429), a full queue or a
                 predicted wait past the deadline (503: the script's Verdict, queueing/admission.py),
                 else LPUSHes onto the lane's queue; a cached model's items, one job per distinct
                 item, answered from the cache where known (`_run_cached`, queueing/cache_plan.py)
    6 await      the replies, through this process's inbox (queueing/inbox.py), until the deadline;
                 a client that leaves first marks its jobs, and no worker runs them
    7 render     the adapter answers the replies, or the error, in its protocol's shape

With tracing on (common/observability/tracing.py) the request is a span, each step from
parse on a child of it, marked as the request enters the step, and its jobs
carry the span's context to the worker. Off, `trace` is NO_TRACE, whose marks
do nothing.

A bulk job (`submit_job`, from routes/jobs.py's routes) takes steps 1 and
3, then its own admission (the bulk queue's room) and the job store instead of
the queue: its items are answered into the job's results, not awaited.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import redis
from werkzeug.wrappers import Request

from funnel.common.bulk import job_submit
from funnel.common.bulk import jobs as bulk_jobs
from funnel.common.bulk.job_store import JobStore
from funnel.common.contracts import priority
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import CONTEXT_FORMAT, Job, Reply, WireError, check_context, encode_job, now_ms
from funnel.common.errors import (
    FunnelError,
    NotFound,
    NotReplicated,
    NoWorker,
    Timeout,
    Unavailable,
    queue_unavailable,
    reply_status,
)
from funnel.common.link import lua_scripts
from funnel.common.observability import tracing
from funnel.common.result_cache import CachePolicy
from funnel.common.tasks import Context, Inputs, Task
from funnel.common.tasks.base import split
from funnel.web import auth, metrics, recently_prepared
from funnel.web.catalog import Catalog
from funnel.web.queueing import cache_plan, push_script
from funnel.web.queueing.admission import Admission
from funnel.web.queueing.inbox import Inbox, Waiter
from funnel.web.queueing.limits import Limit
from funnel.web.queueing.outbox import Outbox
from funnel.web.queueing.push_script import CacheLookup
from funnel.web.queueing.shedding import (
    Calibration,
    Capacity,
    JobSizes,
    WorkerView,
    request_timeout,
)
from funnel.web.queueing.versions import Versions
from funnel.web.settings import WebSettings

Rendered = tuple[int, bytes, list[tuple[str, str]]]  # status, body, extra headers
Rendering = TypeVar("Rendering")  # what a protocol renders a request's answer into
Kept = TypeVar("Kept")  # what an adapter keeps from parsing to render the answer
Waited = TypeVar("Waited")  # what a request's wait makes of its jobs' replies
JobParts = tuple[list[list[Inputs]], list[list[Context | None] | None]]  # each job's items, and their contexts

log = logging.getLogger("funnel.web.pipeline")


@dataclass
class Work(Generic[Kept]):
    """What an adapter parsed from a request: the items to run, how to run them, and what the
    adapter needs again to render the answer (`kept`: its own type)."""

    items: list[Any]
    kept: Kept
    _: KW_ONLY
    ready: bool = False  # the items are the model's own tensors, checked rather than preprocessed
    raw: bool = False  # the replies carry the model's output rows, not the task's results
    lane: str = ""  # the lane the protocol's own parameter asks for ("": the transport's, X-Priority)


@dataclass(frozen=True)
class Answered:
    """What became of a request's items, for its adapter to render."""

    replies: list[Reply]  # one per item, in item order
    prepared: list[Inputs]  # the items' tensors as they were queued (an adapter counts their tokens)
    lane: str  # the priority lane that served it: the one asked for, or lower (admission)
    cache: list[str] = field(default_factory=list)  # each item's hit, miss or coalesced (queueing/cache_plan.py)


@dataclass(frozen=True)
class OpenAIBatchItems:
    """A job whose items come prepared (an OpenAI batch's, routes/batches.py): only checked, run on
    the model version they were prepared for, and described in the job's record (`fields`)."""

    version: int
    fields: dict[str, bytes]  # the record's fields that describe the batch (common/bulk/batch_store.py)


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Who sent a request and how to follow it: what the transport knows before the pipeline starts."""

    request_id: str = ""  # X-Request-ID, or one made up (observability/logs.py): in the jobs, the logs, the answer
    owner: str = ""  # the API key's owner hash ("" where the server has no keys): its limits' keys
    label: str = ""  # that key's label: which limits apply (FUNNEL_KEY_LIMITS)
    traceparent: str = ""  # the client's W3C trace context, the parent of the request's span
    tracestate: str = ""
    priority: str = priority.NORMAL  # the lane X-Priority asks for

    @classmethod
    def of(cls, request_id: str, authorization: str, api_keys: list[str], traceparent: str = "",
           tracestate: str = "", asked_priority: str | None = None) -> Origin:
        """A request's origin from what its transport read (headers, gRPC metadata): 401 without a
        key where FUNNEL_API_KEYS is set, 400 for a priority that is no lane."""
        identity = None
        if api_keys:
            identity = auth.identify(authorization, api_keys)
            if identity is None:
                raise auth.Unauthorized()
        return cls(request_id=request_id, owner=identity.owner if identity else "",
                   label=identity.label if identity else "", traceparent=traceparent, tracestate=tracestate,
                   priority=priority.parse(asked_priority))


@dataclass(frozen=True, kw_only=True)
class Inference:
    """A request's items on their way to one model version: what steps 4 to 6 (`Pipeline.run`) take."""

    model: str
    version: int
    items: list[Inputs]  # prepared (step 3)
    deadline: int  # epoch ms: 504 past it, and no worker runs its jobs after it
    contexts: list[Context | None] | None = None  # each item's, aligned with items (None: no item has one)
    raw: bool = False  # the replies carry the model's output rows, not the task's results
    origin: Origin = Origin()
    lane: str = priority.NORMAL  # as admitted (queueing/admission.py)
    trace: tracing.Trace | tracing.NoTrace = tracing.NO_TRACE  # marks the steps from enqueue on
    cache: CachePolicy = CachePolicy()  # the model's result cache (off unless its model.json asks)
    # A streamed request's: each job's reply as it comes, with the index of its first item and its count
    # of items (a cached model's come together at the end)
    each: Callable[[int, int, Reply], None] | None = None

    def left_s(self) -> float:
        return (self.deadline - now_ms()) / 1000


class Parser(Protocol):
    """What the pipeline asks of a protocol before it queues: the request's items (the gRPC
    service's adapter reads a protobuf message, the others a werkzeug Request)."""

    def parse(self, task: Task, request: Any) -> Work[Any]:
        """The request's items; a FunnelError for a request the protocol cannot read."""
        ...


class Adapter(Parser, Protocol):
    """A protocol's two ends of a predict-like HTTP route (protocols/v1.py, v2.py, openai.py)."""

    def render(self, task: Task, work: Work, answered: Answered) -> tuple[bytes, list[tuple[str, str]]]:
        """A 200's body and headers, from what became of the items."""
        ...

    def render_error(self, error: Exception, request: Request) -> Rendered:
        """Any failure, in the protocol's error shape."""
        ...


class Pipeline:
    def __init__(self, catalog: Catalog, client: redis.Redis, keys: Keys, settings: WebSettings):
        self.catalog, self.client, self.keys, self.settings = catalog, client, keys, settings
        self.inbox = Inbox(client, keys, on_unclaimed=metrics.UNCLAIMED.inc)
        # With FUNNEL_JOB_REPLICAS, a push that queued its jobs (push.lua's answer {1, ...}) on fewer
        # replicas is refused (run, below); its round trips then run off the loop, on the outbox's thread.
        self.outbox = Outbox(client, lua_scripts.register(client, "push"), cluster=keys.cluster,
                             replicas=settings.job_replicas, wrote=lambda answer: answer[0] > 0)
        self.workers = WorkerView(client, keys)
        self.versions = Versions(client, keys, self.workers)
        self.calibration = Calibration()
        self.job_sizes = JobSizes()
        self.bulk_jobs = JobStore(client, keys, ttl_s=settings.job_ttl_s, replicas=settings.job_replicas)
        self.job_limits = job_submit.SubmitLimits.of(settings)
        self.admission = Admission(self.workers, settings)
        self.recently_prepared = recently_prepared.RecentlyPrepared()
        self.spans = tracing.Spans("funnel-web")
        # Sent without waiting for their answers (the request is over): marks for jobs whose client
        # left, and the tokens of finished requests of keys with a cap.
        self.leaving = Outbox(client, lua_scripts.register(client, "leave"), cluster=keys.cluster)
        self.releasing = Outbox(client, lua_scripts.register(client, "release"), cluster=keys.cluster)
        self._unawaited: set[asyncio.Future] = set()

    async def respond(self, adapter: Adapter, request: Request, name: str, version: str | None = None,
                      origin: Origin = Origin(), each: Callable[[int, int, Reply], None] | None = None) -> Rendered:
        """A predict-like request, whole: its status, body and headers, an error included; a streamed one
        also hands each job's reply to each(its first item's index, its items, reply) as it comes."""
        try:
            cap_s = self.settings.request_timeout_s

            def render(task: Task, work: Work, answered: Answered) -> tuple[bytes, list[tuple[str, str]]]:
                body, headers = adapter.render(task, work, answered)
                cached = [("X-Cache", cache_plan.x_cache(answered.cache))] if answered.cache else []
                return body, [*headers, ("X-Priority", answered.lane), *cached]  # the lane served: it may be lower

            body, headers = await self.infer(adapter, request, name, version,
                                             lambda: request_timeout(request.headers, cap_s), origin, render, each)
            return 200, body, headers
        except Exception as exc:
            return adapter.render_error(exc, request)

    async def infer(self, parser: Parser, request: Any, name: str, version: str | None,
                    timeout_s: Callable[[], float], origin: Origin,
                    render: Callable[[Task, Work, Answered], Rendering],
                    each: Callable[[int, int, Reply], None] | None = None) -> Rendering:
        """Steps 1 to 7, whatever protocol parses and renders (the HTTP adapters, the gRPC service),
        in one span when tracing is on. timeout_s is asked once the request is read, so that a bad
        model or body is told before a bad deadline."""
        trace = self.spans.request("predict", name, origin.traceparent, origin.tracestate, origin.request_id)
        with trace:
            task = self.resolve(name, version)
            trace.step("parse", model=name, model_version=task.spec.version)
            work = parser.parse(task, request)
            trace.step("prepare")
            prepared, contexts = arrays_and_contexts(self.prepare(task, work.items, work.ready, origin.owner))
            trace.step("admit", items=len(prepared))
            lane = self.admission.lane(work.lane or origin.priority, origin.label, bool(origin.owner), name,
                                       task.spec.version)
            replies, cache = await self.run(Inference(
                model=name, version=task.spec.version, items=prepared, contexts=contexts,
                deadline=now_ms() + int(timeout_s() * 1000), raw=work.raw, origin=origin, lane=lane, trace=trace,
                cache=task.cache, each=each))
            trace.step("render")
            return render(task, work, Answered(replies, prepared, lane, cache))

    def submit_job(self, name: str, items: list[Any], idempotency_key: str | None, webhook: str | None,
                   body: bytes, caller: bulk_jobs.Caller, origin: Origin = Origin(),
                   prepared: OpenAIBatchItems | None = None) -> tuple[bulk_jobs.Record, bool]:
        """A bulk (or async) job of these items, owned by the caller (the request's API key, or
        anyone where none are set): its record, and whether an earlier submit by the same caller
        with this Idempotency-Key made it (`body`, the raw request, is what a retry must repeat).

        An OpenAI batch (routes/batches.py) hands its items prepared already (`prepared`).

        Resolved and prepared as a predict; then admitted by the bulk queue's room
        (FUNNEL_MAX_BULK_QUEUE, 503) instead of the predicted wait, and created in the job
        store instead of queued and awaited: its items are answered into the job's results (a
        cached model's items whose entries are there, as the job is made: common/bulk/job_store.py).

        With tracing on, the submit is a span (`job <name>`, a child of the origin's traceparent)
        whose context every item carries, so the worker's batch spans link to it; the job's later
        life (its items' batches, its webhook) is in those linked traces, not under this span.
        """
        trace = self.spans.request("job", name, origin.traceparent, origin.tracestate, origin.request_id)
        with trace:
            task = self.resolve(name, str(prepared.version) if prepared else None)
            version = task.spec.version
            trace.annotate(model=name, model_version=version, items=len(items))
            job_submit.check(idempotency_key, webhook, self.job_limits)
            body_sha = job_submit.fingerprint(body, webhook)
            if idempotency_key is not None:  # before any preprocessing: a retry costs a lookup only
                existing = self.bulk_jobs.replay(name, idempotency_key, body_sha, caller)
                if existing is not None:
                    trace.annotate(job_id=existing.id, replayed=True)
                    return existing, True
            created = now_ms()
            job_id = bulk_jobs.new_job_id(created)
            trace.step("prepare", job_id=job_id)
            # Encoded item by item: only the wire bytes of every item are held, not their tensors too.
            scope = task.cache.scope(caller.owner) if task.cache.on else None
            items_ready = self.prepare(task, items, prepared is not None, caller.owner)
            payloads = self.bulk_jobs.item_payloads(job_id, name, created, items_ready, version, trace.traceparent,
                                                    scope)
            payloads.known = self.bulk_jobs.known(job_id, name, version, payloads.idents) if payloads.idents else {}
            trace.step("admit", known=len(payloads.known))
            self.bulk_jobs.check_room(name, len(payloads.payloads) - len(payloads.known), self.settings.max_bulk_queue,
                                 version)
            trace.step("store")
            fields: dict[str, str | bytes] = {"webhook_url": webhook or "", **(prepared.fields if prepared else {})}
            record, replayed = self.bulk_jobs.create(job_id, name, created, payloads, body_sha, fields,
                                                idempotency_key, version, caller=caller)
            if replayed:  # a concurrent submit with the same key made the job first: its items, not these
                trace.annotate(job_id=record.id, replayed=True)
            else:
                metrics.job_submitted(name, caller.label)
                if payloads.idents:
                    metrics.cached(name, version, [cache_plan.HIT if index in payloads.known else cache_plan.MISS
                                                   for index in range(len(payloads.idents))])
                log.info("job %s: %d items of %s version %d for %s", record.id, record.total, name, version,
                         caller.label or "anyone")
            return record, replayed

    # -- 1 resolve, 3 prepare: every route's, bulk jobs' too ----------------------------------

    def stored(self, name: str) -> dict[int, Task]:
        """The versions of a model in the store, loaded or not, and their tasks; 404 for a name not there."""
        versions = self.catalog.versions(name)
        if not versions:
            raise NotFound(f"no model named {name!r}; served: {', '.join(self.catalog.names())}",
                           code="unknown_model")
        return versions

    def resolve(self, name: str, version: str | None = None) -> Task:
        """The task of the model version a request goes to (its spec names the version): the one
        the URL pins, else the traffic policy's pick; 404 for any other name or version, and for an
        unloaded one."""
        versions = self.stored(name)
        unloaded = self.versions.unloaded(name)
        if version is None:
            served = [v for v in versions if v not in unloaded]
            if not served:
                raise NotFound(f"{name} is unloaded (POST /v2/repository/models/{name}/load serves it again)",
                               code="unloaded")
            return versions[self.versions.choose(name, served)]
        task = versions.get(int(version)) if version.isascii() and version.isdigit() else None  # not '²'
        if task is None:
            raise NotFound(f"{name} has no version {version!r}; it has {', '.join(map(str, sorted(versions)))}",
                           code="unknown_version")
        if int(version) in unloaded:
            raise NotFound(f"{name} version {version} is unloaded", code="unloaded")
        return task

    def prepare(self, task: Task, items: list[Any], ready: bool = False,
                owner: str = "") -> Iterator[tuple[Inputs, Context | None]]:
        """Each item's tensors and context in turn, as the worker takes them; a bad item fails the
        request, named by its index (a context the wire cannot carry is the task's fault: a 500).
        A cached model's items this process prepared lately for the same scope (the caller's API
        key's owner) are not prepared again (web/recently_prepared.py)."""
        scope = task.cache.scope(owner) if task.cache.on and not ready else None
        for i, item in enumerate(items):
            try:
                if ready:
                    task.check(item)
                    yield item, None
                    continue
                key: recently_prepared.Key | None = None
                if scope and recently_prepared.kept(item):
                    key = (task.spec.name, task.spec.version, scope, item)
                known = self.recently_prepared.get(key) if key else None
                if known is not None:
                    yield known
                    continue
                inputs, context = split(task.preprocess(item))
                if context is not None:
                    try:
                        check_context(context)
                    except WireError as exc:
                        raise FunnelError(f"{task.spec.task}: {exc}", code="bad_context", status=500) from None
                if key:
                    self.recently_prepared.put(key, inputs, context)
                yield inputs, context
            except FunnelError as exc:
                if len(items) > 1:
                    exc.message = f"item {i}: {exc.message}"
                    exc.args = (exc.message,)
                raise

    # -- 4 admit, 5 enqueue, 6 await -----------------------------------------------------------

    async def run(self, request: Inference) -> tuple[list[Reply], list[str]]:
        """The request's items as jobs (one, or one per batch of the model's workers), queued on the
        model version's queue in its lane, and a reply per item in item order; a failed reply raised.
        A cached model's items go through the cache instead (`_run_cached`), which also gives each
        item's cache state (hit, miss, coalesced; else [])."""
        capacity, known_only = self._capacity(request)
        contexts = carried(request, capacity)
        if contexts is not request.contexts:  # raw rows carry none
            request = replace(request, contexts=contexts)
        if request.cache.on:
            return await self._run_cached(request, capacity, known_only)
        parts = job_parts(request.items, request.contexts, job_size(capacity, len(request.items)))

        async def collect(answer: list, waiter: Waiter, ids: list[str]) -> list[Reply]:
            if request.each is not None:
                first = dict(zip(ids, zip(itertools.accumulate((len(part) for part in parts[0]), initial=0),
                                          (len(part) for part in parts[0]))))
                waiter.follow(lambda reply: request.each(*first[reply.id], reply))  # type: ignore[misc]
            return await self.inbox.collect(waiter, ids, request.deadline)

        limit = self.admission.limit(request.origin.label, bool(request.origin.owner))
        replies = await self._send(request, capacity, parts, new_ids(len(parts[0])), limit=limit, wait=collect)
        metrics.replied(request.model, replies)
        return each_item(parts[0], replies, len(request.items)), []

    async def _run_cached(self, request: Inference, capacity: Capacity, known_only: bool
                          ) -> tuple[list[Reply], list[str]]:
        """A cached model's items (queueing/cache_plan.py): one job per distinct item, which the push
        script answers from the cache, lends from another request's job under way, or queues. An item
        whose borrowed job went unanswered, or whose entry would not decode, is asked again in a later
        round, charged nothing more (the request was admitted once), until the deadline."""
        plan = cache_plan.Plan.of(request.cache, request.origin.owner, request.items, request.raw, request.contexts)
        replies: list[Reply | None] = [None] * len(plan.items)
        kinds = [cache_plan.MISS] * len(plan.items)
        first = cache_plan.Round(list(range(len(plan.items))), read=True)
        rounds, limit = [first], self.admission.limit(request.origin.label, bool(request.origin.owner))

        async def settle(answer: list, waiter: Waiter, ids: list[str]) -> cache_plan.Settled:
            return await cache_plan.settle(self.inbox, request.model, answer[3], waiter, ids, request.deadline)

        self.inbox.lending = True
        while rounds:
            asked = rounds.pop(0)
            if asked is not first:  # admitted once: asking again charges the key nothing more
                if request.left_s() <= 0:
                    raise Timeout("no reply before the deadline")
                capacity, known_only = self._capacity(request, asked.read)
                limit = None
            ids = new_ids(len(asked.distinct))
            lookup = plan.lookup(asked, ids, self.inbox.key(request.model), known_only)
            settled = await self._send(request, capacity, plan.parts(asked), ids, limit=limit, wait=settle,
                                       lookup=lookup)
            for k, reply, kind in zip(asked.distinct, settled.replies, settled.kinds, strict=True):
                replies[k], kinds[k] = reply, kind
            rounds += settled.again(asked)
        states = cache_plan.each_state(plan, kinds)
        metrics.cached(request.model, request.version, states)
        answered = [cache_plan.answered(replies[k]) for k in plan.of_item]
        metrics.replied(request.model, [reply for reply, state in zip(answered, states) if state == cache_plan.MISS])
        return each_item([[item] for item in request.items], answered, len(request.items)), states

    async def _send(self, request: Inference, capacity: Capacity, parts: JobParts, ids: list[str], *,
                    limit: Limit | None, wait: Callable[[list, Waiter, list[str]], Awaitable[Waited]],
                    lookup: CacheLookup | None = None) -> Waited:
        """The parts as jobs named `ids`, pushed in one script call, and what `wait` makes of the push
        script's answer and their replies. limit: the caller's key's, None once admitted.

        429 at once when the caller's key is past its limits; 503 at once when no live worker serves
        the model (unless held, or every item is known), when its queue is at FUNNEL_MAX_QUEUE, or
        when the predicted wait is past the deadline; 504 at the deadline. A client that leaves (the
        task cancelled, transport/front.py) marks the jobs for no worker to run, but a cached
        model's, which other requests may wait on."""
        model, version, trace = request.model, request.version, request.trace
        timeout_s, items = request.left_s(), sum(map(len, parts[0]))
        waiter = self.inbox.expect(model, ids)  # before the push: no reply can come unclaimed
        reply_to = self.inbox.key(model)
        messages = [encode_job(Job(id=job_id, model=model, items=part, reply_to=reply_to,
                                   deadline=request.deadline, raw=request.raw, version=version, trace=trace.traceparent,
                                   request_id=request.origin.request_id,
                                   priority="" if request.lane == priority.NORMAL else request.lane,
                                   cache=lookup.idents[k] if lookup else "", contexts=parts[1][k]))
                    for k, (job_id, part) in enumerate(zip(ids, parts[0], strict=True))]
        calibration = self.calibration.factor(model)
        owner = request.origin.owner if limit else push_script.UNLIMITED
        estimate = capacity.script_args(calibration) if self.settings.shed and capacity.known else None
        push = push_script.PushCall(model=model, version=version, lane=request.lane, jobs=messages, items=items,
                                    per_job=self.job_sizes.of(model), max_queue=self.settings.max_queue,
                                    estimate=estimate, inflight=capacity.workers if estimate else (),
                                    budget_s=timeout_s, owner=owner, limit=limit, now_ms=now_ms(), token=ids[0],
                                    deadline_ms=request.deadline, cache=lookup)
        self.job_sizes.observe(model, items, len(messages))
        ahead, pushed_ms = -1, 0
        try:
            trace.step("enqueue", priority=request.lane)
            answer = await self.outbox.push(push.keys(self.keys), push.args())  # from here on its jobs may be in Redis
            ahead = self.admission.verdict(model, version, answer, capacity, calibration, timeout_s, items)
            pushed_ms = now_ms()
            trace.step("wait")
            known_only = lookup is not None and lookup.known_only
            if not capacity.workers and not self.settings.hold_without_workers and not known_only:
                await self._await_a_worker(waiter, model, version, request.deadline)
            return await wait(answer, waiter, ids)
        except (NotReplicated, NoWorker, redis.RedisError, asyncio.CancelledError) as exc:
            # Queued, or maybe (a push whose answer was lost is never sent again: common/link/line.py),
            # and nobody will read the answers: marked, so that no worker runs them.
            if lookup is None:
                self._unawaited_push(self.leaving, *push_script.leave_call(self.keys, model, now_ms(),
                                                                           request.deadline, ids))
            if isinstance(exc, NotReplicated):
                pushed_ms = now_ms()  # its key's token was taken with the push: released below
            if isinstance(exc, redis.RedisError):
                raise queue_unavailable(exc) from None
            raise
        finally:
            self.inbox.forget(ids)
            if pushed_ms and limit is not None and limit.concurrency:  # its token leaves the key's requests
                self._unawaited_push(self.releasing, *push_script.release_call(self.keys, model, owner, ids[0]))
            if ahead >= 0:  # answered or timed out: either way, how late against the prediction
                self.calibration.observe(model, capacity.wait_s(ahead, items), (now_ms() - pushed_ms) / 1000)

    def _capacity(self, request: Inference, read: bool = True) -> tuple[Capacity, bool]:
        """The version's live workers (admission), and whether the request may be answered from the
        cache alone: with none, a cached model's request is answered if every item is known, else 503
        (push.lua, which then queues nothing); a round that must compute its items again, 503."""
        try:
            return self.admission.capacity(request.model, request.version), False
        except NoWorker:
            if not (request.cache.on and read):
                raise
            return Capacity(()), True

    async def _await_a_worker(self, waiter: Waiter, model: str, version: int, deadline: int) -> None:
        """A request queued in the grace an emptied registry gets (WorkerView.grace_s) waits for
        its answer that long at most, then is answered 503 unless a worker of its version has come."""
        grace_s = min(self.workers.grace_s(model, version), max(0.0, (deadline - now_ms()) / 1000))
        await asyncio.wait([waiter.future], timeout=grace_s)
        if not waiter.future.done() and not self._capacity_or_none(model, version):
            raise NoWorker(model, version)

    def _capacity_or_none(self, model: str, version: int) -> tuple[str, ...]:
        try:
            return self.workers.capacity(model, version).workers
        except redis.RedisError:
            return ()

    def _unawaited_push(self, outbox: Outbox, keys: list[str], args: list) -> None:
        """A script's call sent with the loop's next round trip, its answer not awaited; a failure is
        logged (a mark or token it leaves behind expires with its deadline)."""
        sent = asyncio.ensure_future(outbox.push(keys, args))
        self._unawaited.add(sent)  # held until done: the loop keeps only weak references to tasks
        sent.add_done_callback(self._settled)

    def _settled(self, sent: asyncio.Future) -> None:
        self._unawaited.discard(sent)
        if not sent.cancelled() and sent.exception() is not None:
            log.warning("could not mark a finished request in redis: %s", sent.exception())


def carried(request: Inference, capacity: Capacity) -> list[Context | None] | None:
    """The items' contexts as their jobs carry them: none for raw rows (no postprocess reads them);
    503 while a live worker of the version is of a release that would drop them."""
    if request.contexts is None or request.raw:
        return None
    if capacity.workers and capacity.job_format < CONTEXT_FORMAT:
        raise Unavailable(f"a worker of {request.model} version {request.version} is of a release that drops item "
                          "contexts; upgrade it", code="no_worker")
    return request.contexts


def job_parts(inputs: list[Inputs], contexts: list[Context | None] | None, size: int) -> JobParts:
    """Each job's items and their contexts, `size` items a job."""
    starts = range(0, len(inputs), size)
    return ([inputs[start:start + size] for start in starts],
            [None if contexts is None else contexts[start:start + size] for start in starts])


def new_ids(n: int) -> list[str]:
    """Job ids: uuid4's randomness, at a third of its CPU."""
    return [os.urandom(16).hex() for _ in range(n)]


def arrays_and_contexts(prepared: Iterator[tuple[Inputs, Context | None]]
                        ) -> tuple[list[Inputs], list[Context | None] | None]:
    """Prepared items as their arrays, and their contexts (None when no item has one: its jobs are as before)."""
    pairs = list(prepared)
    contexts = [context for _, context in pairs]
    return [inputs for inputs, _ in pairs], contexts if any(c is not None for c in contexts) else None


def job_size(capacity: Capacity, n: int) -> int:
    """Items a job holds: what a worker runs in one go, its batch; one while a worker of a release
    that reads one item a job (common/contracts/wire.py's JOB_FORMAT 1) serves the model version."""
    if not capacity.workers:
        return n  # held for a worker to come: one job
    return capacity.batch_size if capacity.job_format >= 2 else 1


def each_item(parts: list[list[Inputs]], replies: list[Reply], count: int) -> list[Reply]:
    """A reply per item of the request, in its order, from its jobs' replies (parts: each job's
    items); a failed reply raised, naming its item in the request."""
    answered: list[Reply] = []
    for part, reply in zip(parts, replies, strict=True):
        if not reply.ok:
            raise reply_error(reply, len(answered) + reply.item if reply.item >= 0 else -1, count)
        items = reply.each()
        if len(items) != len(part):  # never hand one item's result to another
            raise FunnelError(f"a worker answered {len(items)} items of a job of {len(part)}",
                              code="inference_failed", status=500)
        answered += items
    return answered


def reply_error(reply: Reply, index: int, count: int) -> FunnelError:
    """A worker's error reply as the client's error: its code, and which item (index, -1 for the
    job's as a whole) when the request had several."""
    error = reply.error or {}
    code, message = error.get("code", "inference_failed"), error.get("message", "")
    if count > 1 and index >= 0:
        message = f"item {index}: {message}"
    return FunnelError(message, code=code, status=reply_status(error))

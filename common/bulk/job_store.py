"""The job store: async and bulk jobs in Redis, created, replayed, read, cancelled and paged.

Plain Redis with explicit arguments, no web framework: the web tier's routes
(web/routes/jobs.py, through web/pipeline.py) parse a request, call this, and render what it returns.

A job is created whole, its record and every item payload in one MULTI/EXEC
(common/bulk/jobs.py has the record's fields): a web process that dies after
answering loses nothing, and one that dies before leaves nothing half made.
An Idempotency-Key (per model and per API key) names the job it made for the
job TTL: a second submit with it from the same API key gets that job back, or
a Conflict when its body differs; concurrent submits with one key make one job
(WATCH on the key). Another API key's same Idempotency-Key is another key.

On a Redis Cluster the record is in its job's slot, the items' bulk queue and
the Idempotency-Key in the model's (common/contracts/keys.py): the record is written
first, then the same WATCH and MULTI queue the items and set the key. Before
the MULTI no item exists, so a worker never finds an item without its record;
a submit that loses the key's race, or fails, deletes the record it wrote. A
web process killed between the two leaves a record with no items, that no
client was told of, until the job TTL expires it (shown queued meanwhile).

With FUNNEL_JOB_REPLICAS a new job is accepted only once that many replicas
hold it (WAIT), on a cluster on both nodes it was written to; else it is
undone and refused (NotReplicated, 503), since a failover could lose it.

Every call that touches a job says who asks (jobs.Caller): a job is its
submitter's, and anyone else (but an admin key) is answered as for an id that
never existed, after the same Redis round trips (no timing tell).

A job id starts with its creation time, so a job that expired (410) is told
from one that never was (404) without a tombstone.

A cached model's items (common/result_cache.py) are looked up before the job is made (`known`):
an item whose entry is there is stored as answered with the record, counted in `done`, and never
queued; the others carry their cache ident, so the worker that answers them fills their entries.
A job whose every item was known is done when it is made, its webhook due at once.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from funnel.common import result_cache
from funnel.common.bulk import jobs
from funnel.common.bulk.jobs import Caller
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Job, encode_job, encode_reply, now_ms
from funnel.common.errors import FunnelError, NotFound, NotReplicated, Overloaded
from funnel.common.link import lua_scripts
from funnel.common.link.connection import node_client

PUSH_CHUNK = 1000  # items per LPUSH inside the create's transaction, and entries per MGET of the cache
ITEM_DEADLINE_MS = 365 * 86_400_000  # bulk items have no deadline of their own: the job's TTL bounds them
RESULTS_CHUNK = 1000  # results per HMGET while streaming: a large job never sits in memory whole
REPLICA_WAIT_MS = 1000  # how long a new job, bulk or interactive, waits for its replicas (FUNNEL_JOB_REPLICAS)


@dataclass
class Items:
    """A job's items as the store writes them (JobStore.item_payloads): each one's wire Job; for a
    cached model each one's cache ident, and those whose entries were there (JobStore.known)."""

    payloads: list[bytes]
    idents: list[str] = field(default_factory=list)
    known: dict[int, bytes] = field(default_factory=dict)  # item index -> its result, from the cache

    @property
    def queued(self) -> list[bytes]:
        """The items to compute: all but the known."""
        return [payload for index, payload in enumerate(self.payloads) if index not in self.known]


class Gone(FunnelError):
    status, code = 410, "job_expired"


class Conflict(FunnelError):
    status, code = 422, "idempotency_key_reused"


class JobStore:
    def __init__(self, client: redis.Redis, keys: Keys, *, ttl_s: int, replicas: int = 0):
        self.client, self.keys, self.ttl_s, self.replicas = client, keys, ttl_s, replicas
        self._cancel = lua_scripts.register(client, "cancel")

    # -- create ----------------------------------------------------------------

    def item_payloads(self, job_id: str, model: str, created_ms: int,
                      prepared: Iterable[tuple[dict, dict | None]], version: int = 1, trace: str = "",
                      scope: str | None = None) -> Items:
        """Each item (its arrays and context) as the wire Job a worker takes from the bulk queue: id
        `<job id>-<index>`, replying into the job's results hash, carrying `trace` (the job span's
        traceparent, "" when not traced); and, for a cached model (scope: whose entries the caller
        reads, else None), each item's cache ident, which its job carries too. Encoded one by one, so
        only the wire bytes of every item are held, not their tensors too."""
        results = self.keys.job_results(job_id)
        payloads, idents = [], []
        for i, (item, context) in enumerate(prepared):
            ident = result_cache.ident(scope, result_cache.digest(item, False, context)) if scope is not None else ""
            payloads.append(encode_job(Job(id=jobs.item_id(job_id, i), model=model, items=[item], reply_to=results,
                                           deadline=created_ms + ITEM_DEADLINE_MS, enqueued=created_ms,
                                           version=version, trace=trace, cache=ident,
                                           contexts=None if context is None else [context])))
            if ident:
                idents.append(ident)
        return Items(payloads, idents)

    def known(self, job_id: str, model: str, version: int, idents: list[str]) -> dict[int, bytes]:
        """The items whose cache entries are there (by index): each its result as the job stores
        it, answered with no batch. An entry that does not read as a success is a miss."""
        found: dict[int, bytes] = {}
        for start in range(0, len(idents), PUSH_CHUNK):
            chunk = idents[start:start + PUSH_CHUNK]
            entries = self.client.mget([self.keys.cache(model, version, ident) for ident in chunk])
            for index, entry in enumerate(entries, start):
                reply = result_cache.entry_reply(entry) if entry is not None else None
                if reply is not None:
                    reply.id = jobs.item_id(job_id, index)
                    found[index] = encode_reply(reply)
        return found

    def check_room(self, model: str, adding: int, max_bulk_queue: int, version: int = 1) -> None:
        """Overloaded (503) when `adding` more items would make the model version's bulk queue longer
        than max_bulk_queue."""
        queued: int = self.client.llen(self.keys.bulk(model, version))
        if queued + adding > max_bulk_queue:
            raise Overloaded(f"the {model} bulk queue holds {queued} items; {adding} more would pass "
                             f"its limit of {max_bulk_queue}; retry later", retry_after=30)

    def create(self, job_id: str, model: str, created_ms: int, items: Items, body_sha256: str,
               fields: dict[str, str | bytes] | None = None, idempotency_key: str | None = None,
               version: int = 1, *, caller: Caller) -> tuple[jobs.Record, bool]:
        """Write the record, owned by the caller, and queue every item in one transaction: (the
        record, False). With an Idempotency-Key that a concurrent submit by the same caller used
        first: (that job's record, True), nothing written; Conflict if that submit's body differed.
        `fields`: the record's optional ones, written where not empty (webhook_url, an OpenAI
        batch's description). Items known from the cache are stored as answered with the record, the
        others queued."""
        ttl_ms = self.ttl_s * 1000
        known, payloads = items.known, items.queued
        total = len(items.payloads)
        finished = bool(known) and not payloads  # every item known: done as it is made
        webhook = (fields or {}).get("webhook_url")
        record: dict = {
            "model": model, "version": version, "total": total, "done": len(known), "failed": 0, "duplicates": 0,
            "created_ms": created_ms, "finished_ms": created_ms if finished else 0, "ttl_ms": ttl_ms,
            "state": "active", "body_sha256": body_sha256, "owner": caller.owner, "owner_label": caller.label,
            **{name: value for name, value in (fields or {}).items() if value},
            **({"webhook_state": "pending", "webhook_next_ms": created_ms} if webhook and finished else {})}
        idem = self._idempotency(model, idempotency_key, caller) if idempotency_key is not None else None
        job, bulk = self.keys.job(job_id), self.keys.bulk(model, version)
        apart = self.keys.cluster  # the record's slot is the job's, the MULTI's the model's: written first
        if apart:
            self._write_record(self.client.pipeline(transaction=True), job, record, ttl_ms, known).execute()
        made = False
        with self._queueing(bulk) as queueing:
            try:
                existing = self._queue_items(queueing, job_id, bulk, record, payloads, idem, body_sha256, caller,
                                             known)
                if existing is not None:
                    return existing, True
                made = True
            finally:
                if apart and not made:  # replayed, refused or failed: no item of it was queued
                    self._forget(job, self.keys.job_results(job_id))
            if self.replicas:
                self._replicated(job, ttl_ms, idem, queueing)
        if finished and webhook and apart:  # the due set is in another slot than the record
            jobs.mark_due(self.client, self.keys, [job_id])
        return jobs.Record.parse(job_id, {k: v if isinstance(v, bytes) else str(v) for k, v in record.items()}), False

    def _queue_items(self, queueing: redis.Redis, job_id: str, bulk: str, record: dict, payloads: list[bytes],
                     idem: str | None, body_sha256: str, caller: Caller,
                     results: dict[int, bytes]) -> jobs.Record | None:
        """One transaction: every item queued, the Idempotency-Key set, on one Redis the record
        written too; None once it ran, or the job a concurrent submit made first with the key.

        Watched: the Idempotency-Key (a key set since by another submit fails the EXEC), and on one
        Redis the new record, so that a connection lost with the EXEC's answer raises WatchError:
        redis-py sends a transaction again unless it watches keys, and the items would be queued twice.
        """
        job, apart, ttl_ms = self.keys.job(job_id), self.keys.cluster, record["ttl_ms"]
        watched = [key for key in (idem, None if apart else job) if key]
        with queueing.pipeline(transaction=True) as pipe:
            while True:
                try:
                    if watched:
                        pipe.watch(*watched)
                    if idem:
                        existing = self._replay(pipe, idem, body_sha256, caller)
                        if existing is not None:
                            return existing
                    pipe.multi()
                    if not apart:
                        self._write_record(pipe, job, record, ttl_ms, results)
                        if record.get("webhook_state") == "pending":  # done as made: its delivery due now
                            pipe.zadd(self.keys.webhooks_due(), {job_id: record["created_ms"]})
                    for start in range(0, len(payloads), PUSH_CHUNK):
                        pipe.lpush(bulk, *payloads[start:start + PUSH_CHUNK])
                    if idem:
                        pipe.set(idem, job_id, px=ttl_ms)
                    pipe.execute()
                    return None
                except redis.WatchError:
                    if not apart and self.client.exists(job):  # it ran; its answer was lost
                        return None
                    # the key changed between WATCH and EXEC, or the EXEC did not run: again

    @contextmanager
    def _queueing(self, bulk: str) -> Iterator[redis.Redis]:
        """The client the items' transaction goes through: the client itself, but on a Redis Cluster
        with replicas to wait for, one connection of its own to the model's node, where the WAIT
        that follows must be sent on the connection of the MULTI (the job's record, elsewhere, has
        a WAIT of its own). A pool's pipelines each take any of its connections: a pool of one."""
        if not (self.keys.cluster and self.replicas):
            yield self.client
            return
        pool = node_client(self.client, bulk).connection_pool
        one = type(pool)(connection_class=pool.connection_class, max_connections=1, **pool.connection_kwargs)
        try:
            yield redis.Redis(connection_pool=one)
        finally:
            one.disconnect()

    def _replicated(self, job: str, ttl_ms: int, idem: str | None, queueing: redis.Redis) -> None:
        """Return once `replicas` replicas hold the job just written, else undo it and refuse (503):
        Redis replicates asynchronously, and a 202 is a promise a failover must not break. WAIT
        counts a connection's own writes, so the wait follows a write of its own (the record's TTL,
        set again) on one connection to the record's node: replicated in order, it is acknowledged
        after the job. On a cluster the items and the Idempotency-Key are on the model's node, whose
        WAIT follows their MULTI on its connection (`queueing`)."""
        pipe = node_client(self.client, job).pipeline(transaction=False)
        pipe.pexpire(job, ttl_ms)
        pipe.wait(self.replicas, REPLICA_WAIT_MS)
        try:
            acknowledged = pipe.execute()[1]
            if self.keys.cluster:
                acknowledged = min(acknowledged, queueing.wait(self.replicas, REPLICA_WAIT_MS))
        except redis.RedisError:
            acknowledged = 0  # on no replica that we know of: undone, as far as Redis lets
        if acknowledged < self.replicas:
            # Its items, already queued, are dropped unrun as a job that never was; a retry with
            # the Idempotency-Key makes it anew.
            self._forget(job, *([idem] if idem else []))
            raise NotReplicated(f"the job was not on {self.replicas} Redis replica(s) within {REPLICA_WAIT_MS} ms, "
                                "so it was not accepted; retry")

    def _write_record(self, pipe: Any, job: str, record: dict, ttl_ms: int, results: dict[int, bytes]) -> Any:
        pipe.hset(job, mapping=record)
        pipe.pexpire(job, ttl_ms)
        if results:  # the items known from the cache, answered as it is made
            results_key = self.keys.job_results(self.keys.job_of(job))
            pipe.hset(results_key, mapping=results)
            pipe.pexpire(results_key, ttl_ms)
        return pipe

    def _forget(self, *keys: str) -> None:
        """Delete a record that was not accepted (a cluster's create that queued none of its items,
        or a job no replica confirmed, whose queued items workers then drop unrun as a job that
        never was), and its Idempotency-Key: best effort, since it fails where Redis has gone, and
        such a key only waits for its TTL. One at a time: on a cluster each is in its own slot."""
        for key in keys:
            try:
                self.client.delete(key)
            except redis.RedisError:
                pass

    def replay(self, model: str, idempotency_key: str, body_sha256: str, caller: Caller) -> jobs.Record | None:
        """The live job this caller's Idempotency-Key made for `model`, else None; Conflict when it
        was made from another body."""
        return self._replay(self.client, self._idempotency(model, idempotency_key, caller), body_sha256, caller)

    def _idempotency(self, model: str, idempotency_key: str, caller: Caller) -> str:
        # Hashed: a client's key may be any text, a Redis key name stays short and plain. Scoped to
        # the caller's API key by its owner hash, behind a NUL no header can hold (so no client's
        # key text can name another's); where the server has no API keys, the key's hash alone.
        text = idempotency_key.encode()
        if caller.owner:
            text = b"owner\0" + caller.owner.encode() + b"\0" + text
        return self.keys.idempotency(model, hashlib.sha256(text).hexdigest()[:48])

    def _replay(self, conn: Any, idem: str, body_sha256: str, caller: Caller) -> jobs.Record | None:
        job_id = conn.get(idem)
        if job_id is None:
            return None
        job_id = job_id.decode()
        # Read by the client, not conn (which may be a pipeline watching idem): on a cluster the
        # record is in another slot than the key, and a watching pipeline stays in one.
        raw = self.client.hgetall(self.keys.job(job_id)) if jobs.is_job_id(job_id) else {}
        if not raw:
            return None  # its job expired: this key makes a new one
        record = jobs.Record.parse(job_id, raw)
        if not hmac.compare_digest(record.owner.encode(), caller.owner.encode()):
            return None  # the key is the caller's own (it holds the owner hash): never another's job
        if record.body_sha256 != body_sha256:
            raise Conflict("this Idempotency-Key was used with a different body")
        return record

    # -- read, cancel ------------------------------------------------------------

    def load(self, job_id: str, caller: Caller, offset: int = 0,
             limit: int = 0) -> tuple[jobs.Record, list[bytes | None]]:
        """The job's record and the result payloads of items offset to offset + limit (fewer past
        its last item; None for one not answered yet), read together. NotFound (404) for a job
        that never was, Gone (410) for one past its TTL; another caller's job (unless the caller is
        an admin) is answered as one that never was, after the same reads and the same compare."""
        if not jobs.is_job_id(job_id):  # the id's shape is public: nothing to hide, nothing read
            raise NotFound(f"no job {job_id!r}", code="unknown_job")
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(self.keys.job(job_id), jobs.FIELDS)  # not an OpenAI batch's description: read apart
        if limit:
            pipe.hmget(self.keys.job_results(job_id), list(range(offset, offset + limit)))
        values, *rest = pipe.execute()
        raw = {field: value for field, value in zip(jobs.FIELDS, values) if value is not None}
        record = jobs.Record.parse(job_id, raw)  # parsed and compared whether or not it exists
        if not caller.may_see(record) or not raw:
            raise self._missing(job_id)
        payloads = rest[0][:max(0, record.total - offset)] if rest else []
        return record, payloads

    def _missing(self, job_id: str) -> FunnelError:
        """What an id with no job the caller may see is answered, decided by the id alone: Gone
        when its creation time is past the TTL, else NotFound."""
        if jobs.created_ms_of(job_id) + self.ttl_s * 1000 <= now_ms():
            return Gone(f"job {job_id} has expired: jobs are kept {self.ttl_s} s after their last progress")
        return NotFound(f"no job {job_id!r}", code="unknown_job")

    def cancel(self, job_id: str, caller: Caller) -> jobs.Record:
        """Cancel the caller's job unless every item is answered (its webhook becomes due), and its
        record after; NotFound or Gone as load(), for another caller's job too, which is left as
        it was."""
        self.load(job_id, caller)  # the caller's to cancel? (an owner never changes: no race)
        # On a cluster the due set is in another slot: the script leaves it, and says whether to mark it.
        due = [] if self.keys.cluster else [self.keys.webhooks_due()]
        _, pending = self._cancel(keys=[self.keys.job(job_id), *due], args=[now_ms(), job_id])
        if pending and not due:
            jobs.mark_due(self.client, self.keys, [job_id])
        return self.load(job_id, caller)[0]

    def result_pages(self, record: jobs.Record, offset: int = 0,
                     chunk: int = RESULTS_CHUNK) -> Iterator[list[bytes | None]]:
        """The job's result payloads from offset to its last item, `chunk` at a time, one HMGET
        each; None for an item not answered yet."""
        key = self.keys.job_results(record.id)
        for start in range(offset, record.total, chunk):
            yield self.client.hmget(key, list(range(start, min(start + chunk, record.total))))  # type: ignore[misc]

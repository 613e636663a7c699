"""Async and bulk jobs: the job record, its states, and how both tiers read and write it.

A job is a hash `funnel:job:{<id>}` (fields below) and a results hash
`funnel:job:{<id>}:results` (item index -> msgpack reply), both tagged with
the job id, so on a Redis Cluster they share a slot. Its items are ordinary
wire Jobs on `funnel:bulk:{<model>}:<version>`, with id `<job id>-<index>` and
reply_to the results hash, so they go through the workers' in-flight lists
and recovery like any other job. A worker stores an item's reply with
HSETNX (a second answer to the same item is counted as a duplicate, never
stored), counts it in `done` and pushes both keys' TTL to the job's
`ttl_ms` from now: results are kept FUNNEL_JOB_TTL_S after a job's last
progress. A worker drops, unrun, the items of a cancelled or expired job.

Where a worker stores: on a single Redis in the MULTI whose reply script
forgets the batch's messages from its in-flight list (store_results), all or
nothing. On a cluster the results are in the job's slot and the in-flight
list in the model's, so no one step holds both: the results are stored first
(store_results_apart), then the reply script runs. A worker that dies between
the two leaves the messages in flight; recovery requeues them, and their
second answer is counted, not stored: nothing acknowledged is lost, nothing
stored twice.

The state is derived, never stored, except for `cancelled`:

    queued     no item answered yet
    running    some items answered
    done       every item answered (failed items carry their error)
    failed     every item answered and every one failed
    cancelled  DELETE /v1/jobs/<id> before it was done: items not yet taken never run

A job records who submitted it: `owner`, a keyed hash of the API key (never
the key; web/auth.py makes it), and `owner_label`, the name FUNNEL_API_KEYS
gives that key (both "" where the server has no API keys). Only its owner, or
an admin key, may read or cancel it (Caller, below; common/bulk/job_store.py checks).

A job submitted with a webhook carries `webhook_url`; the step that makes it
final (the last item stored, or the cancel) sets its `webhook_state` to
pending and, on a single Redis, makes its delivery due in the same script
(common/link/lua/store_results.lua, cancel.lua). On a cluster the due set is in
another slot: the caller marks it due (mark_due, ZADD NX) after every store
or cancel that finds the delivery pending, and a worker does the same for a
cancelled job whose items it drops, so a process that dies between the two
steps leaves the mark to the next answer, drop or cancel of the job (the
deliverer drops marks of deliveries no longer pending).

common/bulk/job_store.py creates, reads and cancels jobs for the web tier.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

import redis

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, encode_reply, now_ms, peek_job
from funnel.common.link import lua_scripts

STATES = ("queued", "running", "done", "failed", "cancelled")

# Record fields, all strings in Redis; "state" is "active" until cancelled. The webhook_* fields
# exist only for a job submitted with a webhook; worker/webhook.py writes all but the URL.
FIELDS = ("model", "version", "total", "done", "failed", "duplicates", "created_ms", "finished_ms",
          "ttl_ms", "state", "body_sha256", "owner", "owner_label", "webhook_url", "webhook_state", "webhook_attempts",
          "webhook_last_status", "webhook_last_error", "webhook_next_ms", "webhook_claim")

# A job made by an OpenAI batch (POST /v1/batches) also holds this field: the batch's description,
# msgpack (common/bulk/batch_store.py), so that it is written and expires with the record.
BATCH_FIELD = "batch"

_ID_TIME_DIGITS = 12  # a job id starts with its creation time, epoch ms in hex


def new_job_id(created_ms: int | None = None) -> str:
    """32 hex digits: the creation time (ms, 12 digits) then 80 random bits."""
    return f"{(created_ms if created_ms is not None else now_ms()):0{_ID_TIME_DIGITS}x}{secrets.token_hex(10)}"


def is_job_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def created_ms_of(job_id: str) -> int:
    return int(job_id[:_ID_TIME_DIGITS], 16)


def item_id(job_id: str, index: int) -> str:
    return f"{job_id}-{index}"


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who submits, reads or cancels a job: the API key's owner hash and label (web/auth.py), and
    whether it is an admin key, which may read and cancel any job. Passed explicitly to every job
    store call that touches a job: a door that reaches jobs has to say who is asking."""

    owner: str   # the key's keyed hash (hex), never the key; "" where the server has no API keys
    label: str   # the key's name in FUNNEL_API_KEYS, for metrics, logs and `funnel inspect`
    admin: bool = False

    @classmethod
    def anyone(cls) -> Caller:
        """The server has no API keys: nobody owns a job, everyone reads any job (as before keys)."""
        return cls(owner="", label="", admin=True)

    def may_see(self, record: Record) -> bool:
        """Whether this caller may read and cancel the job: its owner (the hashes compared in
        constant time) or an admin. The comparison is made whatever the answer, so the time
        taken says nothing."""
        return self.owns(record.owner)

    def owns(self, owner: str) -> bool:
        """Whether this caller may see what `owner` (an owner hash) made: the same key, or an admin;
        compared in constant time whatever the answer."""
        same = hmac.compare_digest(self.owner.encode(), owner.encode())
        return same or self.admin


@dataclass(kw_only=True)
class Record:
    id: str
    model: str
    total: int
    done: int
    failed: int
    duplicates: int
    created_ms: int
    finished_ms: int
    ttl_ms: int
    cancelled: bool
    body_sha256: str
    webhook_url: str = ""
    webhook_state: str = ""       # "" until the job is final, then pending, delivered or failed
    webhook_attempts: int = 0
    webhook_last_status: int = 0  # the receiver's last HTTP status (0: none came back)
    webhook_last_error: str = ""
    webhook_next_ms: int = 0
    version: int = 1  # the model version its items run on, chosen at submit
    owner: str = ""        # the submitting API key's keyed hash; never shown in a status or a webhook
    owner_label: str = ""  # that key's label (FUNNEL_API_KEYS)

    @classmethod
    def parse(cls, job_id: str, raw: dict) -> Record:
        # Only the record's own fields: a batch's description (BATCH_FIELD) is msgpack, not text.
        fields = {key: (v.decode() if isinstance(v, bytes) else v)
                  for k, v in raw.items() if (key := k.decode() if isinstance(k, bytes) else k) in FIELDS}

        def number(name: str) -> int:
            return int(fields.get(name) or 0)

        return cls(id=job_id, model=fields.get("model", ""), total=number("total"), done=number("done"),
                   failed=number("failed"), duplicates=number("duplicates"),
                   created_ms=number("created_ms"), finished_ms=number("finished_ms"),
                   ttl_ms=number("ttl_ms"), cancelled=fields.get("state") == "cancelled",
                   body_sha256=fields.get("body_sha256", ""), webhook_url=fields.get("webhook_url", ""),
                   webhook_state=fields.get("webhook_state", ""), webhook_attempts=number("webhook_attempts"),
                   webhook_last_status=number("webhook_last_status"),
                   webhook_last_error=fields.get("webhook_last_error", ""),
                   webhook_next_ms=number("webhook_next_ms"), version=number("version") or 1,
                   owner=fields.get("owner", ""), owner_label=fields.get("owner_label", ""))

    @property
    def state(self) -> str:
        if self.total and self.done >= self.total:
            return "failed" if self.failed >= self.total else "done"
        if self.cancelled:
            return "cancelled"
        return "running" if self.done else "queued"

    def status(self, webhook: bool = True) -> dict:
        """The job as GET /v1/jobs/<id> shows it (without a page of results), and as its webhook
        delivers it (webhook=False: without the delivery's own state). Never its owner: only
        the owner (or an admin) is shown a status at all."""
        body: dict = {
            "id": self.id, "model": self.model, "model_version": self.version, "state": self.state,
            "progress": {"done": self.done, "total": self.total, "failed": self.failed},
            "created_ms": self.created_ms, "finished_ms": self.finished_ms or None,
            "ttl_s": self.ttl_ms // 1000,
            "links": {"self": f"/v1/jobs/{self.id}", "results": f"/v1/jobs/{self.id}/results"},
        }
        if webhook and self.webhook_url:
            state = self.webhook_state or "pending"  # pending: the job is not final yet, or it is due
            body["webhook"] = {
                "url": self.webhook_url, "state": state, "attempts": self.webhook_attempts,
                "last_status": self.webhook_last_status or None, "last_error": self.webhook_last_error or None,
                "next_attempt_ms": (self.webhook_next_ms or None) if self.webhook_state == "pending" else None,
            }
        return body


# -- the worker's side -------------------------------------------------------

def _store_call(keys: Keys, results_key: str, replies: list[Reply],
                messages: dict[str, tuple[bytes, int]] | None = None) -> tuple[str, list] | None:
    """(job id, the store script's ARGV) for these item replies (with messages, each item's message
    as taken, its handle and length (common/contracts/wire.py), by its id); None when none is an
    item of the job whose results hash this is."""
    job_id = keys.job_of_results(results_key)
    args: list = [now_ms(), job_id]
    for reply in replies:
        head, _, index = reply.id.rpartition("-")
        if head == job_id and index.isdigit():  # else not an item of this job (a forged message)
            args += [int(index), encode_reply(reply), int(reply.ok),
                     *(messages.get(reply.id, (b"", 0)) if messages is not None else ())]
    return (job_id, args) if len(args) > 2 else None


def store_results(pipe, keys: Keys, results_key: str, replies: list[Reply], inflight: str = "",
                  messages: dict[str, tuple[bytes, int]] | None = None) -> None:
    """Queue, on a pipeline (MULTI) of a single Redis, the store of these item replies into their
    job's results hash (common/link/lua/store_results.lua: once per index; an expired job's are
    dropped), its webhook made due in the same step. Not on a cluster: store_results_apart.

    A worker's reply MULTI names its in-flight list and each item's message (by its id): an item
    is then stored only while its message is still in flight, as the reply script answers."""
    call = _store_call(keys, results_key, replies, messages if inflight else None)
    if call is not None:
        job_id, args = call
        lua_scripts.register(pipe, "store_results")(
            keys=[keys.job(job_id), results_key, keys.webhooks_due(), *([inflight] if inflight else [])], args=args)


def store_results_apart(client: redis.Redis, keys: Keys, results_key: str, replies: list[Reply]) -> None:
    """Store these item replies as steps of their own, for a Redis Cluster (the job's slot is
    neither its model's nor the due set's): the store script, then the delivery's due mark while
    its webhook is pending. Both are safe to run again, so a caller runs this before it forgets the
    items' messages: dying in between, it has them run again, their answers counted as duplicates."""
    call = _store_call(keys, results_key, replies)
    if call is not None:
        job_id, args = call
        _, pending = lua_scripts.register(client, "store_results")(keys=[keys.job(job_id), results_key], args=args)
        if pending:
            mark_due(client, keys, [job_id])


def mark_due(client: redis.Redis, keys: Keys, job_ids: list[str]) -> None:
    """Make these jobs' pending webhook deliveries due now, where a script could not in the step that
    made them pending (a cluster): ZADD NX, so a delivery already due, leased or waiting for its
    retry keeps its time, and marking twice is marking once. A mark the deliverer finds no longer
    pending (delivered, failed, expired) it drops (common/link/lua/webhook_claim.lua)."""
    if job_ids:
        client.zadd(keys.webhooks_due(), {job_id: now_ms() for job_id in job_ids}, nx=True)


def drop_stopped(client: redis.Redis, keys: Keys, raws: list[bytes]) -> tuple[list[bytes], int]:
    """The taken messages less the items of cancelled or expired jobs, and how many were dropped.

    One round trip, only when the batch holds bulk items; a second (mark_due) when a cancelled
    job's webhook is still pending: on a cluster the cancel marks it apart, and a web process that
    died between the two left it to this.
    """
    marker = keys.job_prefix().encode()  # only a bulk item's message holds it: skip decoding the rest
    jobs_of = [keys.job_of_results(peek_job(raw).get("reply_to", "")) if marker in raw else ""
               for raw in raws]
    wanted = sorted({job_id for job_id in jobs_of if job_id})
    if not wanted:
        return raws, 0
    pipe = client.pipeline(transaction=False)  # on a cluster, split by node: each record is one key
    for job_id in wanted:
        pipe.hmget(keys.job(job_id), "state", "webhook_state")
    states = dict(zip(wanted, pipe.execute()))
    # "active" from submit; "cancelled" by DELETE; None: the record expired (or never was).
    stopped = {job_id for job_id, (state, _) in states.items() if state != b"active"}
    mark_due(client, keys, [job_id for job_id, (state, hook) in states.items()
                            if state == b"cancelled" and hook == b"pending"])
    kept = [raw for raw, job_id in zip(raws, jobs_of) if job_id not in stopped]
    return kept, len(raws) - len(kept)


"""Answering a batch: every reply, dead letter and forgetting its jobs in flight, in one transaction.

Other batches of the same worker may share its in-flight list (the next one
taken while this one ran), so a batch removes its own messages, each named by
its handle (common/contracts/wire.py: a long message by its first bytes) and
found from the old end where they lie, rather than the whole list. A message's
reply is pushed, and its dead letter parked, only if it was found
(common/link/lua/reply.lua): a worker paused past its heartbeat, whose jobs a peer
recovered and requeued, answers none of them a second time, nor does a second
run of the same answer (its EXEC's answer lost).

A job of a cached item (common/result_cache.py) names its item's ident: the reply script stores a
success as the item's entry and hands the reply to the requests waiting on the item's pending
marker, in the same step, so a waiting request learns the answer however many workers died first.
A bulk item of a cached model fills its entry the same way (nobody waits on a bulk item's marker).

Every key of the reply script carries the model's hash tag (the worker checks
each job's reply_to against its model, worker/batch.py), so on Redis Cluster
it stays in one slot. Bulk items' results are stored once per item
(common/link/lua/store_results.lua): on a single Redis in the same MULTI as the
reply script, and only while the item's message is still in flight, as the
reply script answers; on a cluster, where they live in their job's slot, in
steps of their own before it (common/bulk/jobs.py, store_results_apart), so a
crash in between leaves the items in flight, for recovery to run again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

import redis

from funnel.common.bulk.jobs import store_results, store_results_apart
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, encode_reply, handle
from funnel.common.link import lua_scripts
from funnel.worker.hold import Hold


@dataclass(frozen=True)
class Replier:
    """Answers one worker's batches (a worker holds one, for its replier's thread)."""

    client: redis.Redis
    keys: Keys
    _: KW_ONLY
    worker_id: str
    model: str
    ttl_s: int  # an unread reply list's life
    version: int = 1  # the model version answered: its cache entries' keys name it
    cache_ttl_s: int = 0  # a cached item's entry's life (0: the model does not cache)
    hold: Hold = field(default_factory=lambda: Hold(threading.Event()))  # the fault suite's seam (stored)

    def answer(self, replies: list[tuple[str, Reply]], dead: list[bytes], taken: Sequence[bytes] = (),
               taken_ids: Sequence[str] = (), cached: Mapping[str, str] = {},
               counted: Sequence[tuple] = ()) -> list[str]:
        """Store the bulk items' results; then, for each message taken (its job's id in taken_ids, ""
        if it had none), forget it, and push its reply or park it as dead only if it was still in
        flight (cached: the cache ident of each job of a cached item, by job id). Returns the ids
        of the jobs answered: those still held (bulk items on a cluster: all), which the soak's job
        ledger records (benchmarks/ledger.py).

        All or nothing on a single Redis (one script, or a MULTI with the bulk results, each stored
        only while its message is still in flight): a crash before it leaves the jobs in flight for
        recovery, a crash after leaves nothing half done. On a cluster the bulk results are stored
        first: a crash before the reply script leaves their messages in flight, and their second
        answer is counted, never stored.

        `counted`: the batch's statistics' commands (common/contracts/statistics.py), sent in the same
        round trip (on a cluster, one of their own after the reply script).
        """
        by_job, by_id = sorted_replies(self.keys, replies)
        call = ReplyCall.of(self, by_id, by_job, dead, taken, taken_ids, cached)
        if by_job and self.keys.cluster:  # each job's own slot: stored before its messages are forgotten
            for results_key, items in by_job.items():
                store_results_apart(self.client, self.keys, results_key, items)
            self.hold("stored")
        if not by_job or self.keys.cluster:  # the script alone is atomic; a cluster's pipelines run no scripts
            held = lua_scripts.runner(self.client, "reply")(call.keys, call.args, counted) if taken else []
            if counted and not taken:
                lua_scripts.send(self.client, counted)
        else:  # bulk items on a single Redis: their results and the replies in one MULTI
            pipe = self.client.pipeline(transaction=True)
            held_by = self.keys.inflight(self.model, self.worker_id) if taken else ""  # only while in flight
            for results_key, answered in by_job.items():
                store_results(pipe, self.keys, results_key, answered, held_by, call.messages)
            for command in counted:  # before the script, whose answer comes last
                pipe.execute_command(*command)
            if taken:
                lua_scripts.register(pipe, "reply")(keys=call.keys, args=call.args)
            done = pipe.execute(raise_on_error=False)  # a figure that fails leaves the answer done
            figures = range(len(done) - len(counted) - bool(taken), len(done) - bool(taken))
            failed = [answer for at, answer in enumerate(done) if isinstance(answer, Exception) and at not in figures]
            if failed:
                raise failed[0]
            held = done[-1] if taken else []
        # Stored whoever held them: on a cluster (apart, first), or when no message was named.
        apart = [reply.id for answered in by_job.values() for reply in answered] \
            if self.keys.cluster or not taken else []
        return apart + [job_id for job_id, still in zip(call.replied, held) if job_id and still and job_id not in apart]


def sorted_replies(keys: Keys, replies: list[tuple[str, Reply]]
                   ) -> tuple[dict[str, list[Reply]], dict[str, tuple[str, Reply]]]:
    """The items of async and bulk jobs by their results hash (stored by index, not pushed), and the
    interactive jobs' replies by job id (pushed to their reply list)."""
    by_job: dict[str, list[Reply]] = {}
    by_id: dict[str, tuple[str, Reply]] = {}
    for reply_to, reply in replies:
        if keys.job_of_results(reply_to):
            by_job.setdefault(reply_to, []).append(reply)
        else:
            by_id[reply.id] = (reply_to, reply)
    return by_job, by_id


@dataclass
class ReplyCall:
    """common/link/lua/reply.lua's KEYS and ARGV for one batch, laid out as its header names them."""

    keys: list[str]
    args: list
    replied: list[str]  # per message taken: the id of the job it answers (a bulk item's own), "" if none
    messages: dict[str, tuple[bytes, int]]  # a bulk item's id -> its message's handle and length:
    # stored only while still in flight

    @classmethod
    def of(cls, replier: Replier, by_id: dict[str, tuple[str, Reply]], by_job: dict[str, list[Reply]],
           dead: list[bytes], taken: Sequence[bytes], taken_ids: Sequence[str],
           cached: Mapping[str, str] = {}) -> ReplyCall:
        lists: list[str] = []  # the reply lists, KEYS[3..]
        entries: list[str] = []  # then each cached item's entry and pending marker
        parked, waiting = set(dead), dict(by_id)
        call = cls([], [replier.ttl_s, replier.cache_ttl_s * 1000], [], {})
        items = {reply.id: reply for answered in by_job.values() for reply in answered}
        item_ids = set(items)
        for raw, job_id in zip(taken, taken_ids, strict=True):
            found = waiting.pop(job_id, None)
            if found is not None and found[0] not in lists:
                lists.append(found[0])
            ident = cached.get(job_id, "") if replier.cache_ttl_s else ""
            if ident:
                entries += [replier.keys.cache(replier.model, replier.version, ident),
                            replier.keys.cache_pending(replier.model, replier.version, ident)]
            # What the entry holds: the reply pushed, or a bulk item's result (stored apart, pushed to none).
            answer = found[1] if found else items.get(job_id) if ident else None
            named = handle(raw, job_id)
            call.args += [named, len(raw), lists.index(found[0]) + 3 if found else 0,
                          encode_reply(answer) if answer else b"",
                          int(bool(parked) and raw in parked),  # hashing an image costs more than answering it
                          len(entries) - 1 if ident else 0, job_id, int(bool(answer and answer.ok and ident))]
            call.replied.append(job_id if found or job_id in item_ids else "")
            if job_id in item_ids:
                call.messages[job_id] = (named, len(raw))
        if waiting:
            raise ValueError(f"replies to jobs this batch did not take: {sorted(waiting)}")
        call.keys = [replier.keys.inflight(replier.model, replier.worker_id), replier.keys.dead(replier.model), *lists]
        offset = len(call.keys)  # the entries' indices in KEYS, counted from the first entry
        for at in range(7, len(call.args), 8):
            if call.args[at]:
                call.args[at] += offset
        call.keys += entries
        return call

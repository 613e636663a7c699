"""Recovering the jobs of a dead worker.

A worker whose heartbeat key has expired is dead. A live peer (or the same
worker id on restart) claims its in-flight list once, atomically, and puts
each job back at the old end of its queue (its priority lane's, or the bulk
queue for an item of an async or bulk job) with one more attempt; a job past
the attempt limit gets an error reply and goes to the dead-letter list.

The queue is the job's own version's (the message names it; a message from
before versions is version 1), whatever version the peer serves: a peer of
version 1 puts a dead version-2 worker's jobs back on version 2's queue, for
version 2's workers. Every version's queues carry the model's hash tag, so the
requeue stays one MULTI in one slot.
"""

from __future__ import annotations

import logging

import redis

from funnel.common.bulk.jobs import store_results, store_results_apart
from funnel.common.contracts import priority, registry
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, WireError, decode_job, encode_job, encode_reply
from funnel.common.link import lua_scripts

log = logging.getLogger(__name__)

LOCK_MS = 30_000  # a claimer that dies mid-recovery releases the claim after this

class Recovery:
    def __init__(self, client: redis.Redis, keys: Keys, claimer_id: str, *, max_attempts: int,
                 reply_ttl_s: int):
        self.client, self.keys, self.claimer_id = client, keys, claimer_id
        self.max_attempts, self.reply_ttl_s = max_attempts, reply_ttl_s
        self._claim = lua_scripts.register(client, "recovery_claim")

    def sweep(self) -> int:
        """Recover every registered worker whose heartbeat has expired; jobs requeued."""
        listed = registry.registered(self.client, self.keys)
        # One round trip to find the silent ones; only those get the claim script.
        live = registry.alive(self.client, self.keys, listed)
        return sum(self.recover(worker_id, model)
                   for (worker_id, model), is_live in zip(listed.items(), live) if not is_live)

    def recover(self, worker_id: str, model: str) -> int:
        k = self.keys
        lock, recovering = k.recovering_lock(model, worker_id), k.recovering(model, worker_id)
        claimed = self._claim(keys=[k.worker(model, worker_id), k.inflight(model, worker_id), recovering, lock],
                              args=[self.claimer_id, LOCK_MS])
        if not claimed:
            return 0
        raws: list[bytes] = self.client.lrange(recovering, 0, -1)[::-1]  # type: ignore[assignment]
        requeue: dict[str, list[bytes]] = {}
        pipe = self.client.pipeline(transaction=True)
        for raw in raws:
            self._sort(raw, model, requeue, pipe)
        for queue, jobs in requeue.items():
            # RPUSH oldest last: the oldest job ends at the right, taken first.
            pipe.rpush(queue, *jobs[::-1])
        pipe.delete(recovering, lock)
        pipe.execute()
        # After the MULTI, not in it: the registry hash lives in another slot on a cluster. A crash
        # between the two leaves the worker listed; the next sweep claims its empty lists and delists it.
        self.client.hdel(k.workers(), worker_id)
        count = sum(len(jobs) for jobs in requeue.values())
        if raws:
            log.warning("recovered %d of %d jobs held by dead worker %s", count, len(raws), worker_id)
        return count

    def _sort(self, raw: bytes, model: str, requeue: dict, pipe) -> None:
        """Requeue a job with one more attempt, or dead-letter it with an error reply."""
        try:
            job = decode_job(raw)
            if job.model != model:  # not this worker's: its queue is in another slot on a cluster
                raise ValueError(f"a {job.model} job held by a {model} worker")
            bulk = bool(self.keys.job_of_results(job.reply_to))
            queue = (self.keys.bulk(job.model, job.version) if bulk
                     else self.keys.queue(job.model, job.version, job.priority or priority.NORMAL))
        except (WireError, ValueError):
            pipe.lpush(self.keys.dead(model), raw)
            return
        job.attempt += 1
        if job.attempt < self.max_attempts:
            requeue.setdefault(queue, []).append(encode_job(job))
            return
        log.error("job %s failed %d attempts; dead-lettered", job.id, job.attempt)
        pipe.lpush(self.keys.dead(model), raw)
        reply = Reply.failure(job.id, "too_many_attempts",
                              f"the workers running this job died {job.attempt} times", version=job.version)
        if bulk and not self.keys.cluster:
            store_results(pipe, self.keys, job.reply_to, [reply])
        elif bulk:  # a cluster: the job's slot is not the model's; stored now, once (a second run is a duplicate)
            store_results_apart(self.client, self.keys, job.reply_to, [reply])
        elif self.keys.is_reply(job.reply_to, model):
            pipe.lpush(job.reply_to, encode_reply(reply))
            pipe.expire(job.reply_to, self.reply_ttl_s)


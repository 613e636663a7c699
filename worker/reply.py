"""Answering a batch: every reply, dead letter and forgetting its jobs in flight, in one transaction.

Other batches of the same worker may share its in-flight list (the next one
taken while this one ran), so a batch removes its own messages, one LREM each
from the old end where they lie, rather than the whole list. A message's
reply is pushed, and its dead letter parked, only if that LREM found it
(common/lua/reply.lua): a worker paused past its heartbeat, whose jobs a peer
recovered and requeued, answers none of them a second time, nor does a second
run of the same answer (its EXEC's answer lost).

Every key of the reply script carries the model's hash tag (the worker checks
each job's reply_to against its model, worker/batch.py), so on Redis Cluster
it stays in one slot. Bulk items' results are stored once per item
(common/lua/store_results.lua): on a single Redis in the same MULTI as the
reply script, and only while the item's message is still in flight, as the
reply script answers; on a cluster, where they live in their job's slot, in
steps of their own before it (common/jobs.py, store_results_apart), so a
crash in between leaves the items in flight, for recovery to run again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import redis

from funnel.common import lua_scripts
from funnel.common.jobs import store_results, store_results_apart
from funnel.common.keys import Keys
from funnel.common.wire import Reply, encode_reply
from funnel.worker.hold import Hold

# The fault suite's seam between the two steps of a cluster's bulk answer (FUNNEL_TEST_HOLD=stored:...);
# unset, a call that returns at once. Its own: the pipeline's Hold (worker/steps.py) never reaches in here.
_hold = Hold(threading.Event())


def answer(client: redis.Redis, keys: Keys, worker_id: str, model: str,
           replies: list[tuple[str, Reply]], dead: list[bytes], ttl_s: int, taken: Sequence[bytes] = (),
           taken_ids: Sequence[str] = ()) -> list[str]:
    """Store the bulk items' results; then, for each message taken (its job's id in taken_ids, "" if
    it had none), forget it, and push its reply or park it as dead only if it was still in flight.
    Returns the ids of the jobs answered: those still held (bulk items on a cluster: all).

    All or nothing on a single Redis (one script, or a MULTI with the bulk results, each stored only
    while its message is still in flight): a crash before it leaves the jobs in flight for recovery,
    a crash after leaves nothing half done. On a cluster the bulk results are stored first: a crash
    before the reply script leaves their messages in flight, and their second answer is counted,
    never stored.
    """
    by_job: dict[str, list[Reply]] = {}  # items of async and bulk jobs: stored by index, not pushed
    by_id: dict[str, tuple[str, Reply]] = {}
    for reply_to, reply in replies:
        if keys.job_of_results(reply_to):
            by_job.setdefault(reply_to, []).append(reply)
        else:
            by_id[reply.id] = (reply_to, reply)
    lists: list[str] = []  # the reply lists, KEYS[3..] of the reply script
    parked = set(dead)
    args: list = [ttl_s]
    replied = []  # per message: the id of the job it answers (a bulk item's own), "" if none
    item_ids = {reply.id for answered in by_job.values() for reply in answered}
    messages: dict[str, bytes] = {}  # a bulk item's id -> its message: stored only while still in flight
    for raw, job_id in zip(taken, taken_ids, strict=True):
        found = by_id.pop(job_id, None)
        if found is not None and found[0] not in lists:
            lists.append(found[0])
        args += [raw, lists.index(found[0]) + 3 if found else 0, encode_reply(found[1]) if found else b"",
                 int(raw in parked)]
        replied.append(job_id if found or job_id in item_ids else "")
        if job_id in item_ids:
            messages[job_id] = raw
    if by_id:
        raise ValueError(f"replies to jobs this batch did not take: {sorted(by_id)}")
    reply_keys = [keys.inflight(model, worker_id), keys.dead(model), *lists]
    if by_job and keys.cluster:  # each job's own slot: stored before its messages are forgotten
        for results_key, items in by_job.items():
            store_results_apart(client, keys, results_key, items)
        _hold("stored")
    if not by_job or keys.cluster:  # the script alone is atomic; and a Redis Cluster's pipelines run no scripts
        held = lua_scripts.runner(client, "reply")(reply_keys, args) if taken else []
    else:  # bulk items on a single Redis: their results and the replies in one MULTI
        pipe = client.pipeline(transaction=True)
        held_by = keys.inflight(model, worker_id) if taken else ""  # stored only while still in flight
        for results_key, answered in by_job.items():
            store_results(pipe, keys, results_key, answered, held_by, messages)
        if taken:
            lua_scripts.register(pipe, "reply")(keys=reply_keys, args=args)
        done = pipe.execute()
        held = done[-1] if taken else []
    # Stored whoever held them: on a cluster (apart, first), or when no message was named.
    apart = [reply.id for answered in by_job.values() for reply in answered] if keys.cluster or not taken else []
    return apart + [job_id for job_id, still in zip(replied, held) if job_id and still and job_id not in apart]

"""Answering a batch (worker/reply.py, common/lua/reply.lua) against a real Redis: a reply goes out
only while its job is still in the worker's hands."""

from __future__ import annotations

import numpy as np

from funnel.common.wire import Job, Reply, decode_reply, encode_job
from funnel.worker.reply import answer

MODEL = "m"


def taken(redis_client, keys, worker: str, n: int) -> tuple[list[bytes], list[str], list[tuple[str, Reply]]]:
    """n jobs as a worker holds them (in its in-flight list), and their replies."""
    inbox = keys.reply(MODEL, "web-1")
    jobs = [Job(id=f"job-{i}", model=MODEL, inputs={"x": np.zeros(1, np.float32)}, reply_to=inbox,
                deadline=2**40) for i in range(n)]
    raws = [encode_job(job) for job in jobs]
    redis_client.lpush(keys.inflight(MODEL, worker), *raws)
    return raws, [j.id for j in jobs], [(inbox, Reply(id=j.id, ok=True, outputs={"y": 1})) for j in jobs]


def test_a_batch_still_held_is_answered_and_forgotten(redis_client, keys):
    raws, ids, replies = taken(redis_client, keys, "w1", 3)
    assert answer(redis_client, keys, "w1", MODEL, replies, [], 60, raws, ids) == ids
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert sorted(pushed) == ids and redis_client.llen(keys.inflight(MODEL, "w1")) == 0
    assert 0 < redis_client.ttl(keys.reply(MODEL, "web-1")) <= 60


def test_jobs_recovered_while_the_worker_was_paused_are_not_answered_again(redis_client, keys):
    raws, ids, replies = taken(redis_client, keys, "w2", 3)
    # A peer found w2 dead (its heartbeat lapsed while it was paused) and requeued two of its jobs.
    for raw in raws[:2]:
        redis_client.lrem(keys.inflight(MODEL, "w2"), 1, raw)
        redis_client.lpush(keys.queue(MODEL), raw)
    assert answer(redis_client, keys, "w2", MODEL, replies, [raws[0]], 60, raws, ids) == ids[2:]
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert pushed == ids[2:]  # the requeued ones are their next worker's to answer
    assert redis_client.llen(keys.dead(MODEL)) == 0  # nor parked: it is no longer this worker's
    # The same answer again (its first EXEC's answer lost): nothing more goes out.
    assert answer(redis_client, keys, "w2", MODEL, replies, [], 60, raws, ids) == []
    assert redis_client.llen(keys.reply(MODEL, "web-1")) == 1

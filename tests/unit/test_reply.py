"""Answering a batch (worker/reply.py, common/link/lua/reply.lua) against a real Redis: a reply goes out
only while its job is still in the worker's hands."""

from __future__ import annotations

import numpy as np

from funnel.common.contracts.wire import Job, Reply, decode_reply, encode_job
from funnel.worker.reply import Replier

MODEL = "m"


def taken(redis_client, keys, worker: str, n: int) -> tuple[list[bytes], list[str], list[tuple[str, Reply]]]:
    """n jobs as a worker holds them (in its in-flight list), and their replies."""
    inbox = keys.reply(MODEL, "web-1")
    jobs = [Job(id=f"job-{i}", model=MODEL, items=[{"x": np.zeros(1, np.float32)}], reply_to=inbox,
                deadline=2**40) for i in range(n)]
    raws = [encode_job(job) for job in jobs]
    redis_client.lpush(keys.inflight(MODEL, worker), *raws)
    return raws, [j.id for j in jobs], [(inbox, Reply(id=j.id, ok=True, outputs={"y": 1})) for j in jobs]


def test_a_batch_still_held_is_answered_and_forgotten(redis_client, keys):
    raws, ids, replies = taken(redis_client, keys, "w1", 3)
    assert Replier(redis_client, keys, "w1", MODEL, 60).answer(replies, [], raws, ids) == ids
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert sorted(pushed) == ids and redis_client.llen(keys.inflight(MODEL, "w1")) == 0
    assert 0 < redis_client.ttl(keys.reply(MODEL, "web-1")) <= 60


def test_jobs_recovered_while_the_worker_was_paused_are_not_answered_again(redis_client, keys):
    raws, ids, replies = taken(redis_client, keys, "w2", 3)
    # A peer found w2 dead (its heartbeat lapsed while it was paused) and requeued two of its jobs.
    for raw in raws[:2]:
        redis_client.lrem(keys.inflight(MODEL, "w2"), 1, raw)
        redis_client.lpush(keys.queue(MODEL), raw)
    assert Replier(redis_client, keys, "w2", MODEL, 60).answer(replies, [raws[0]], raws, ids) == ids[2:]
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert pushed == ids[2:]  # the requeued ones are their next worker's to answer
    assert redis_client.llen(keys.dead(MODEL)) == 0  # nor parked: it is no longer this worker's
    # The same answer again (its first EXEC's answer lost): nothing more goes out.
    assert Replier(redis_client, keys, "w2", MODEL, 60).answer(replies, [], raws, ids) == []
    assert redis_client.llen(keys.reply(MODEL, "web-1")) == 1


def test_bulk_items_recovered_while_the_worker_was_paused_are_not_stored_by_it(redis_client, keys):
    from funnel.common.bulk import jobs
    from tests.unit.test_jobs import item, make_job

    job_id = make_job(redis_client, keys, 3)
    raws = [item(keys, job_id, i) for i in range(3)]
    ids = [jobs.item_id(job_id, i) for i in range(3)]
    redis_client.lpush(keys.inflight("m", "w3"), *raws)
    redis_client.lrem(keys.inflight("m", "w3"), 1, raws[0])  # a peer requeued item 0 while w3 was paused
    results = keys.job_results(job_id)
    replies = [(results, Reply(id=i, ok=True, outputs={"y": 1})) for i in ids]
    assert Replier(redis_client, keys, "w3", "m", 60).answer(replies, [], raws, ids) == ids[1:]
    assert sorted(redis_client.hkeys(results)) == [b"1", b"2"]  # item 0 is its next worker's to store
    record = redis_client.hgetall(keys.job(job_id))
    assert record[b"done"] == b"2" and record.get(b"duplicates", b"0") == b"0"
    assert redis_client.llen(keys.inflight("m", "w3")) == 0

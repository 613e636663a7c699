"""Jobs' pieces without a stack: ids, keys, states, the fair take, result storage, cancelled items."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from funnel.common.bulk import jobs
from funnel.common.contracts.wire import Job, Reply, decode_job, decode_reply, encode_job, now_ms
from funnel.common.link.connection import connect
from funnel.web.routes.jobs import wants_async
from funnel.worker import queue as worker_queue
from funnel.worker.linger import Linger
from funnel.worker.queue import JobQueue
from funnel.worker.reply import Replier
from tests.cutting_proxy import CuttingProxy


def test_job_ids_carry_their_creation_time():
    created = now_ms()
    job_id = jobs.new_job_id(created)
    assert jobs.is_job_id(job_id) and jobs.created_ms_of(job_id) == created
    assert not jobs.is_job_id("x" * 32) and not jobs.is_job_id(job_id[:-1])
    assert jobs.item_id(job_id, 7) == f"{job_id}-7"


def test_job_keys(keys):
    assert keys.bulk("m") == "funnel:bulk:{m}:1"
    assert keys.job("abc") == "funnel:job:{abc}" and keys.job_results("abc") == "funnel:job:{abc}:results"
    assert keys.job_of_results("funnel:job:{abc}:results") == "abc" and keys.job_of("funnel:job:{abc}") == "abc"
    assert keys.job_of_results("funnel:job:{abc}") == "" and keys.job_of_results("funnel:reply:abc") == ""
    assert keys.job_of("funnel:job:{abc}:results") == "" and keys.job_of("funnel:job:abc") == ""
    assert keys.job_of_results("funnel:job:{a:b}:results") == "" and keys.job_of("funnel:job:{a}b}") == ""
    assert keys.is_reply("funnel:job:{abc}:results", "m") and not keys.is_reply("funnel:job:{abc}", "m")
    assert keys.idempotency("m", "ab12") == "funnel:idempotency:{m}:ab12"
    with pytest.raises(ValueError):
        keys.bulk("bad name")


@pytest.mark.parametrize("done,failed,cancelled,state", [
    (0, 0, False, "queued"), (3, 0, False, "running"), (10, 1, False, "done"), (10, 10, False, "failed"),
    (3, 0, True, "cancelled"), (10, 0, True, "done")])
def test_states(done, failed, cancelled, state):
    record = jobs.Record.parse("j", {b"total": b"10", b"done": str(done).encode(), b"failed": str(failed).encode(),
                                     b"state": b"cancelled" if cancelled else b"active"})
    assert record.state == state and state in jobs.STATES


@pytest.mark.parametrize("header,wanted", [("respond-async", True), ("wait=5, Respond-Async", True),
                                           ("respond-async; x=1", True), ("", False), ("return=minimal", False)])
def test_prefer_header(header, wanted):
    assert wants_async(header) is wanted


class FixedWait(Linger):
    """Waits this long for more jobs whatever it has seen (worker/linger.py's waits only once it has
    timed batches and arrivals): time for a take to poll its queues again."""

    def budget_s(self, held: int, batch_size: int) -> float:
        return 0.0 if held >= batch_size else self.linger_s


def item(keys, job_id: str, index: int, model="m") -> bytes:
    return encode_job(Job(id=jobs.item_id(job_id, index), model=model, items=[{"x": np.zeros(1, np.int32)}],
                          reply_to=keys.job_results(job_id), deadline=now_ms() + 60_000))


def interactive(keys, n: int, model="m") -> bytes:
    return encode_job(Job(id=f"i{n}", model=model, items=[{"x": np.zeros(1, np.int32)}],
                          reply_to=keys.reply("m", f"i{n}"), deadline=now_ms() + 60_000))


def make_job(client, keys, total: int, state="active") -> str:
    job_id = jobs.new_job_id()
    client.hset(keys.job(job_id), mapping={"model": "m", "total": total, "done": 0, "failed": 0,
                                           "ttl_ms": 60_000, "state": state})
    return job_id


def test_batches_fill_from_interactive_first_with_a_share_for_bulk(redis_client, keys):
    job_id = make_job(redis_client, keys, 100)
    redis_client.lpush(keys.bulk("m"), *[item(keys, job_id, i) for i in range(100)])
    redis_client.lpush(keys.queue("m"), *[interactive(keys, i) for i in range(100)])
    queue = JobQueue(redis_client, keys, model="m", worker_id="w1", bulk_share=0.25)
    linger = Linger(0)
    taken = queue.take(8, linger, 0.1).jobs
    assert sum(keys.job(job_id).encode() in raw for raw in taken) == 2  # ceil(0.25 * 8)
    assert len(taken) == 8 and redis_client.llen(keys.inflight("m", "w1")) == 8
    redis_client.delete(keys.queue("m"), keys.inflight("m", "w1"))
    linger = FixedWait(20)  # time to poll again: bulk still keeps to its share
    taken = queue.take(8, linger, 0.1).jobs  # interactive jobs came just now: a small bulk batch
    assert len(taken) == 2 and all(keys.job(job_id).encode() in raw for raw in taken)
    redis_client.delete(keys.inflight("m", "w1"))
    queue._interactive_at -= worker_queue.INTERACTIVE_RECENT_S  # none since: bulk fills the batch
    taken = queue.take(8, linger, 0.1).jobs
    assert len(taken) == 8 and all(keys.job(job_id).encode() in raw for raw in taken)
    # Oldest first: items 4.. (0 to 3 went in the first two takes), in order.
    assert [decode_job(raw).id.rsplit("-", 1)[1] for raw in taken] == [str(i) for i in range(4, 12)]


def test_items_of_cancelled_or_expired_jobs_are_dropped_unrun(redis_client, keys):
    cancelled = make_job(redis_client, keys, 3, state="cancelled")
    live = make_job(redis_client, keys, 3)
    redis_client.lpush(keys.bulk("m"), item(keys, cancelled, 0), item(keys, "f" * 32, 0),
                       item(keys, live, 0), item(keys, cancelled, 1))
    queue = JobQueue(redis_client, keys, model="m", worker_id="w1")
    taken = queue.take(8, Linger(0), 0.1).jobs
    assert len(taken) == 1 and live.encode() in taken[0] and queue.dropped == 3
    assert redis_client.llen(keys.bulk("m")) == 0


def test_replies_are_stored_by_index_once_with_the_jobs_ttl(redis_client, keys):
    job_id = make_job(redis_client, keys, 3)
    results = keys.job_results(job_id)
    ok = Reply(id=jobs.item_id(job_id, 2), ok=True, outputs={"y": np.ones(2, np.float32)})
    bad = Reply.failure(jobs.item_id(job_id, 0), "bad_input", "no")
    Replier(redis_client, keys, worker_id="w1", model="m", ttl_s=60).answer([(results, ok), (results, bad)], [])
    # answered twice: stored once
    Replier(redis_client, keys, worker_id="w1", model="m", ttl_s=60).answer([(results, ok)], [])
    record = jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id)))
    assert (record.done, record.failed, record.duplicates, record.state) == (2, 1, 1, "running")
    assert decode_reply(redis_client.hget(results, 2)).ok and not redis_client.hexists(results, 1)
    assert 0 < redis_client.pttl(results) <= 60_000 and 0 < redis_client.pttl(keys.job(job_id)) <= 60_000
    last = Reply(id=jobs.item_id(job_id, 1), ok=True, outputs={"y": 1})
    Replier(redis_client, keys, worker_id="w1", model="m", ttl_s=60).answer([(results, last)], [])
    record = jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id)))
    assert record.state == "done" and record.finished_ms > 0


def test_results_of_an_expired_job_are_dropped(redis_client, keys):
    job_id = jobs.new_job_id()
    reply = Reply(id=jobs.item_id(job_id, 0), ok=True, outputs={"y": 1})
    Replier(redis_client, keys, worker_id="w1", model="m", ttl_s=60).answer([(keys.job_results(job_id), reply)], [])
    assert not redis_client.exists(keys.job_results(job_id), keys.job(job_id))


def test_jobs_of_a_take_whose_answer_was_lost_are_taken_next(redis_server, keys):
    """The take script ran, its answer was lost, the client's retry ran it again: the first run's
    jobs sit in the in-flight list unseen, and the worker collects them once its batches are answered."""
    proxy = CuttingProxy(redis_server.port)
    client = connect(f"redis://127.0.0.1:{proxy.port}", socket_timeout=3)
    direct = redis.Redis(port=redis_server.port)
    direct.flushall()
    try:
        direct.lpush(keys.queue("m"), *[interactive(keys, i) for i in range(6)])
        queue = JobQueue(client, keys, model="m", worker_id="w1")
        first = queue.take(2, Linger(0), 0.1).jobs
        assert [decode_job(raw).id for raw in first] == ["i0", "i1"]
        proxy.arm(after=b"EVALSHA")
        second = queue.take(2, Linger(0), 0.1).jobs  # i2 and i3 taken by the lost run, i4 and i5 by the retry
        assert proxy.cuts == 1 and [decode_job(raw).id for raw in second] == ["i4", "i5"]
        for raw in first + second:  # answered: out of the in-flight list
            direct.lrem(keys.inflight("m", "w1"), 0, raw)
        queue.forget(len(first) + len(second))
        assert sorted(decode_job(raw).id for raw in queue.take(2, Linger(0), 0.1).jobs) == ["i2", "i3"]
    finally:
        client.close()
        proxy.close()

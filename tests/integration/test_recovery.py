"""Recovering a dead worker's jobs, against a real redis-server."""

import numpy as np

from funnel.common import wire
from funnel.common.wire import Job
from funnel.worker.recovery import Recovery

MODEL = "text-embedding"


def job(i: int, attempt: int = 0) -> Job:
    return Job(id=f"job{i}", model=MODEL, inputs={"input_ids": np.array([101, 102], np.int32)},
               reply_to=f"funnel:reply:{{{MODEL}}}:job{i}", deadline=wire.now_ms() + 60_000, attempt=attempt)


def hold(client, keys, worker_id, jobs, alive=False):
    """Make worker_id a registered worker holding jobs (taken oldest first, so LPUSHed in order)."""
    client.hset(keys.workers(), worker_id, MODEL)
    for j in jobs:
        client.lpush(keys.inflight(MODEL, worker_id), wire.encode_job(j))
    if alive:
        client.set(keys.worker(MODEL, worker_id), "{}", px=10_000)


def test_a_dead_workers_jobs_go_back_to_the_head_of_the_queue(redis_client, keys):
    redis_client.lpush(keys.queue(MODEL), wire.encode_job(job(99)))  # a newer job already queued
    hold(redis_client, keys, "dead-1", [job(1), job(2), job(3)])
    recovery = Recovery(redis_client, keys, "peer", max_attempts=3, reply_ttl_s=60)
    assert recovery.sweep() == 3
    # Taken from the right: the recovered jobs first, oldest first, before the newer one.
    order = [wire.decode_job(raw) for raw in redis_client.lrange(keys.queue(MODEL), 0, -1)[::-1]]
    assert [j.id for j in order] == ["job1", "job2", "job3", "job99"]
    assert [j.attempt for j in order] == [1, 1, 1, 0]
    assert not redis_client.exists(keys.inflight(MODEL, "dead-1"), keys.recovering(MODEL, "dead-1"))
    assert not redis_client.hexists(keys.workers(), "dead-1")


def test_recovery_happens_once(redis_client, keys):
    hold(redis_client, keys, "dead-2", [job(1), job(2)])
    first = Recovery(redis_client, keys, "peer-a", 3, 60)
    second = Recovery(redis_client, keys, "peer-b", 3, 60)
    assert first.sweep() + second.sweep() == 2
    assert first.sweep() + second.sweep() == 0
    assert redis_client.llen(keys.queue(MODEL)) == 2


def test_live_workers_are_left_alone(redis_client, keys):
    hold(redis_client, keys, "alive-1", [job(1)], alive=True)
    assert Recovery(redis_client, keys, "peer", 3, 60).sweep() == 0
    assert redis_client.llen(keys.inflight(MODEL, "alive-1")) == 1


def test_a_claimer_that_died_mid_recovery_is_taken_over(redis_client, keys):
    hold(redis_client, keys, "dead-3", [job(1)])
    # peer-a claimed (moved the jobs, took the lock) and died before requeueing.
    redis_client.rpoplpush(keys.inflight(MODEL, "dead-3"), keys.recovering(MODEL, "dead-3"))
    recovery = Recovery(redis_client, keys, "peer-b", 3, 60)
    assert recovery.sweep() == 1
    assert redis_client.llen(keys.queue(MODEL)) == 1


def test_jobs_past_the_attempt_limit_are_dead_lettered_with_an_error_reply(redis_client, keys):
    hold(redis_client, keys, "dead-4", [job(1, attempt=2), job(2, attempt=0)])
    assert Recovery(redis_client, keys, "peer", 3, 60).sweep() == 1
    reply = wire.decode_reply(redis_client.lpop(f"funnel:reply:{{{MODEL}}}:job1"))
    assert not reply.ok and reply.error["code"] == "too_many_attempts"
    assert [wire.decode_job(r).id for r in redis_client.lrange(keys.dead(MODEL), 0, -1)] == ["job1"]
    assert [wire.decode_job(r).id for r in redis_client.lrange(keys.queue(MODEL), 0, -1)] == ["job2"]


def test_garbage_held_by_a_dead_worker_is_dead_lettered(redis_client, keys):
    redis_client.hset(keys.workers(), "dead-5", MODEL)
    redis_client.lpush(keys.inflight(MODEL, "dead-5"), b"\x93garbage")
    assert Recovery(redis_client, keys, "peer", 3, 60).sweep() == 0
    assert redis_client.lrange(keys.dead(MODEL), 0, -1) == [b"\x93garbage"]

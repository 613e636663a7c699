"""Recovering a dead worker's jobs, against a real redis-server."""

import msgpack
import numpy as np

from funnel.common.contracts import wire
from funnel.common.contracts.wire import Job
from funnel.worker.recovery import Recovery

MODEL = "text-embedding"


def job(i: int, attempt: int = 0, version: int = 1, reply_to: str = "") -> Job:
    return Job(id=f"job{i}", model=MODEL, items=[{"input_ids": np.array([101, 102], np.int32)}],
               reply_to=reply_to or f"funnel:reply:{{{MODEL}}}:job{i}", deadline=wire.now_ms() + 60_000,
               attempt=attempt, version=version)


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
    first = Recovery(redis_client, keys, "peer-a", max_attempts=3, reply_ttl_s=60)
    second = Recovery(redis_client, keys, "peer-b", max_attempts=3, reply_ttl_s=60)
    assert first.sweep() + second.sweep() == 2
    assert first.sweep() + second.sweep() == 0
    assert redis_client.llen(keys.queue(MODEL)) == 2


def test_live_workers_are_left_alone(redis_client, keys):
    hold(redis_client, keys, "alive-1", [job(1)], alive=True)
    assert Recovery(redis_client, keys, "peer", max_attempts=3, reply_ttl_s=60).sweep() == 0
    assert redis_client.llen(keys.inflight(MODEL, "alive-1")) == 1


def test_a_claimer_that_died_mid_recovery_is_taken_over(redis_client, keys):
    hold(redis_client, keys, "dead-3", [job(1)])
    # peer-a claimed (moved the jobs, took the lock) and died before requeueing.
    redis_client.rpoplpush(keys.inflight(MODEL, "dead-3"), keys.recovering(MODEL, "dead-3"))
    recovery = Recovery(redis_client, keys, "peer-b", max_attempts=3, reply_ttl_s=60)
    assert recovery.sweep() == 1
    assert redis_client.llen(keys.queue(MODEL)) == 1


def test_jobs_past_the_attempt_limit_are_dead_lettered_with_an_error_reply(redis_client, keys):
    hold(redis_client, keys, "dead-4", [job(1, attempt=2), job(2, attempt=0)])
    assert Recovery(redis_client, keys, "peer", max_attempts=3, reply_ttl_s=60).sweep() == 1
    reply = wire.decode_reply(redis_client.lpop(f"funnel:reply:{{{MODEL}}}:job1"))
    assert not reply.ok and reply.error["code"] == "too_many_attempts"
    assert [wire.decode_job(r).id for r in redis_client.lrange(keys.dead(MODEL), 0, -1)] == ["job1"]
    assert [wire.decode_job(r).id for r in redis_client.lrange(keys.queue(MODEL), 0, -1)] == ["job2"]


def test_garbage_held_by_a_dead_worker_is_dead_lettered(redis_client, keys):
    redis_client.hset(keys.workers(), "dead-5", MODEL)
    redis_client.lpush(keys.inflight(MODEL, "dead-5"), b"\x93garbage")
    assert Recovery(redis_client, keys, "peer", max_attempts=3, reply_ttl_s=60).sweep() == 0
    assert redis_client.lrange(keys.dead(MODEL), 0, -1) == [b"\x93garbage"]


def test_each_job_goes_back_to_its_own_versions_queue(redis_client, keys):
    """A dead version-2 worker's jobs go to version 2's queues, whoever recovers them (here a
    version-1 peer); a bulk item to its version's bulk queue; a message from before versions to
    version 1's."""
    results = keys.job_results("a" * 32)
    held = [job(1, version=2), job(2, version=2, reply_to=results), job(3, version=2), job(4)]
    hold(redis_client, keys, "dead-v2", held)
    old = msgpack.unpackb(wire.encode_job(job(5)), raw=False)
    del old["version"]
    redis_client.lpush(keys.inflight(MODEL, "dead-v2"), msgpack.packb(old, use_bin_type=True))
    assert Recovery(redis_client, keys, "peer-v1", max_attempts=3, reply_ttl_s=60).sweep() == 5

    def queued(key):
        return [(j.id, j.version, j.attempt) for j in map(wire.decode_job, redis_client.lrange(key, 0, -1)[::-1])]

    assert queued(keys.queue(MODEL, 2)) == [("job1", 2, 1), ("job3", 2, 1)]
    assert queued(keys.bulk(MODEL, 2)) == [("job2", 2, 1)]
    assert queued(keys.queue(MODEL, 1)) == [("job4", 1, 1), ("job5", 1, 1)]
    assert not redis_client.exists(keys.bulk(MODEL, 1), keys.inflight(MODEL, "dead-v2"))


def test_a_version_2_job_past_the_attempt_limit_is_answered_by_version_2(redis_client, keys):
    hold(redis_client, keys, "dead-v2b", [job(1, attempt=2, version=2)])
    assert Recovery(redis_client, keys, "peer", max_attempts=3, reply_ttl_s=60).sweep() == 0
    reply = wire.decode_reply(redis_client.lpop(f"funnel:reply:{{{MODEL}}}:job1"))
    assert reply.error["code"] == "too_many_attempts" and reply.version == 2
    assert [wire.decode_job(r).version for r in redis_client.lrange(keys.dead(MODEL), 0, -1)] == [2]  # per model


def test_an_outage_longer_than_the_heartbeat_ttl_makes_no_live_worker_look_dead(redis_server, redis_client, keys):
    """Redis unreachable for longer than the TTL (a slow failover): the hashes of live workers expire
    meanwhile. A peer back from it sweeps only once it has beaten on time for a whole TTL, by when a
    live worker has beaten again: its jobs stay in its hands, never run twice."""
    import redis as redis_py

    from funnel.worker.heartbeat import Heartbeat
    from tests.cutting_proxy import CuttingProxy
    from tests.support import wait_for

    ttl_s = 1.5
    proxy = CuttingProxy(redis_server.port)
    through = redis_py.Redis(port=proxy.port, socket_timeout=1, socket_connect_timeout=1)
    peer = Heartbeat(through, keys, "peer", {"model": MODEL},
                     Recovery(through, keys, "peer", max_attempts=3, reply_ttl_s=60), ttl_s=ttl_s)
    peer.start()
    try:
        hold(redis_client, keys, "live", [job(1)])

        def beat_live() -> None:  # what the live worker's own heartbeat does
            redis_client.set(keys.worker(MODEL, "live"), "{}", px=int(ttl_s * 1000))

        def seen() -> float:
            return float(redis_client.hget(keys.worker(MODEL, "peer"), "seen") or 0)

        def next_beat() -> None:
            beat_live()
            last = seen()
            wait_for(lambda: seen() > last, timeout_s=5, what="the peer's next beat")

        # Steady: the live worker beats every third of a TTL, and the peer leaves it alone.
        for _ in range(4):
            next_beat()
        proxy.go_down()  # both lose Redis: the live worker stops beating too
        wait_for(lambda: not redis_client.exists(keys.worker(MODEL, "live"), keys.worker(MODEL, "peer")),
                 timeout_s=10, what="both hashes expired")
        proxy.up()
        wait_for(lambda: seen() > 0, timeout_s=10, what="the peer beating again")
        beat_live()  # the live worker's first beat after the outage, within a third of a TTL of the peer's
        for _ in range(4):  # a TTL and more of the peer's beats (and sweeps)
            next_beat()
        assert redis_client.llen(keys.inflight(MODEL, "live")) == 1
        assert redis_client.llen(keys.queue(MODEL)) == 0 and peer.stats.fields().get("recovered", 0) in (0, "0")
    finally:
        peer.stop()
        proxy.close()

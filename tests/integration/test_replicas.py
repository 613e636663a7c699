"""FUNNEL_JOB_REPLICAS=1 against real replicas: a new job is accepted only once a replica holds it.

Behind Sentinel (a primary and its replica): an interactive push is acknowledged (the pipeline goes
on to await its replies, where the soak's ledger counts it) only once the replica holds its job;
with the replica stopped the request is refused 503 `not_replicated` after the WAIT's second, its
jobs marked gone and its key's token released, while the event loop goes on serving. On a Redis
Cluster with a replica per primary: a push waits on its model's node, a bulk job on both nodes it
is written to (its record's, its items').

A replica is held back with SIGSTOP; "held until it holds the job" is shown by resuming it only
once the primary has a client blocked in WAIT, and finding the job on it when the call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.common.bulk import jobs
from funnel.common.bulk.job_store import REPLICA_WAIT_MS, JobStore
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import decode_job, now_ms
from funnel.common.errors import NotReplicated, Timeout
from funnel.common.link.connection import connect
from funnel.scripts.redis_local import LocalCluster, LocalRedis, ask, wait_until
from funnel.web.catalog import Catalog
from funnel.web.pipeline import Inference, Origin, Pipeline
from funnel.web.queueing.outbox import Outbox
from funnel.web.settings import WebSettings

MODEL, OTHER = "text-embedding", "image-classifier"  # on different primaries of a three-way cluster
INPUTS = [{"input_ids": np.arange(4, dtype=np.int32)}]
WAIT_S = REPLICA_WAIT_MS / 1000
KEYS = Keys()


@contextlib.contextmanager
def stopped(*servers: LocalRedis):
    """The servers frozen (SIGSTOP) as a lagging replica, resumed on leaving (resume() may do it first)."""
    for server in servers:
        os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for server in servers:
            resume(server)


def resume(server: LocalRedis) -> None:
    os.kill(server.process.pid, signal.SIGCONT)


def waiting(primary: LocalRedis) -> bool:
    """A client of the primary is blocked in WAIT."""
    return any(client.get("cmd") == "wait" for client in ask(primary.port, lambda c: c.client_list(), []))


@contextlib.contextmanager
def gateway(client: redis.Redis, keys: Keys, **settings):
    """The web tier's pipeline with FUNNEL_JOB_REPLICAS=1 (no models in its catalog: run() takes
    prepared inputs; no worker needed, none registered), its inbox closed after."""
    opened = Pipeline(Catalog("/nonexistent", [], {}), client, keys,
                      WebSettings(job_replicas=1, shed=False, hold_without_workers=True, **settings))
    try:
        yield opened
    finally:
        opened.inbox.close()


def queued_ids(server: LocalRedis | redis.Redis, key: str) -> list[str]:
    client = server if isinstance(server, redis.Redis) else redis.Redis(port=server.port)
    return [decode_job(raw).id for raw in client.lrange(key, 0, -1)]


# -- behind Sentinel ------------------------------------------------------------------------------

def test_a_push_is_acknowledged_only_once_the_replica_holds_its_job(sentinels):
    primary, replica = sentinels.primary, sentinels.replica
    with gateway(connect(sentinels.url, socket_timeout=5), KEYS) as pipeline:
        acknowledged: dict = {}

        async def collect(waiter, ids, deadline):  # the pipeline's step once the push is acknowledged
            acknowledged.update(ids=ids, at=time.monotonic(), on_replica=queued_ids(replica, KEYS.queue(MODEL)))
            raise Timeout("the test looked; no worker answers")

        pipeline.inbox.collect = collect  # type: ignore[method-assign]

        async def push_while_the_replica_lags() -> float:
            with stopped(replica):
                pushing = asyncio.ensure_future(pipeline.run(Inference(model=MODEL, version=1, items=INPUTS,
                                                                        deadline=now_ms() + 10_000)))
                await asyncio.to_thread(wait_until, lambda: waiting(primary), 5, "the push's WAIT")
                resumed = time.monotonic()
                resume(replica)
                with pytest.raises(Timeout):
                    await asyncio.wait_for(pushing, 5)
            return resumed

        resumed = asyncio.run(push_while_the_replica_lags())
    assert acknowledged["at"] > resumed  # held while the replica lagged
    assert acknowledged["on_replica"] == acknowledged["ids"]  # on the replica when acknowledged


def test_a_push_no_replica_holds_is_refused_and_undone_while_the_loop_serves_on(sentinels):
    """503 not_replicated after the WAIT's second; its job marked gone (no worker runs it) and the
    key's token released; meanwhile the event loop is never held (a 10 ms ticker never stalls)."""
    primary = redis.Redis(port=sentinels.primary.port)
    origin = Origin(owner="a" * 64, label="alice")
    limits = json.dumps({"alice": {"concurrency": 2}})
    with gateway(connect(sentinels.url, socket_timeout=5), KEYS, key_limits=limits) as pipeline, \
            stopped(sentinels.replica):

        async def refused() -> tuple[NotReplicated, float, list[float]]:
            ticks: list[float] = []

            async def ticker() -> None:
                while True:
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.01)

            ticking = asyncio.ensure_future(ticker())
            started = time.monotonic()
            with pytest.raises(NotReplicated) as caught:
                await asyncio.wait_for(pipeline.run(Inference(
                    model=MODEL, version=1, items=INPUTS, deadline=now_ms() + 10_000, origin=origin)), 10)
            took = time.monotonic() - started
            ticking.cancel()
            [job_id] = queued_ids(sentinels.primary, KEYS.queue(MODEL))  # pushed to the primary all the same

            def undone() -> bool:
                return (primary.zscore(KEYS.gone(MODEL), job_id) is not None
                        and primary.zcard(KEYS.running(MODEL, origin.owner)) == 0)

            await asyncio.to_thread(wait_until, undone, 5, "the job marked gone and the key's token released")
            return caught.value, took, [b - a for a, b in zip(ticks, ticks[1:])]

        error, took, gaps = asyncio.run(refused())
    assert (error.status, error.code, error.retry_after) == (503, "not_replicated", 1)
    assert WAIT_S <= took < WAIT_S + 2
    assert len(gaps) > 20 and max(gaps) < 0.25, max(gaps)  # the loop ran on through the WAIT's second


# -- on a Redis Cluster ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def replicated_cluster():
    """Three primaries, each with a replica."""
    with LocalCluster(replicas=1) as cluster:
        yield cluster


def replica_of(cluster: LocalCluster, key: str) -> LocalRedis:
    primary = cluster.node_of(key)
    return next(node for node in cluster.nodes if node is not primary
                and ask(node.port, lambda c: c.info("replication"), {}).get("master_port") == primary.port)


def reading(replica: LocalRedis) -> redis.Redis:
    """A client of a cluster replica that reads its own keys (READONLY), not sent on to its primary."""
    client = redis.Redis(port=replica.port, single_connection_client=True)
    client.execute_command("READONLY")
    return client


def test_on_a_cluster_each_push_waits_for_its_own_nodes_replica(replicated_cluster):
    cluster, keys = replicated_cluster, Keys(cluster=True)
    client = connect(cluster.url, socket_timeout=5)
    script = client.register_script("return {redis.call('LPUSH', KEYS[1], ARGV[1]), ARGV[1]}")
    outbox = Outbox(client, script, cluster=True, replicas=1)
    mine, theirs = keys.queue(MODEL), keys.queue(OTHER)
    assert cluster.node_of(mine) is not cluster.node_of(theirs)
    lagging = replica_of(cluster, mine)

    async def both() -> tuple[list, float, float]:
        pushed: list[float] = []

        async def push(key: str, job: str):
            try:
                return await outbox.push([key], [job])
            finally:
                pushed.append(time.monotonic())

        with stopped(lagging):
            pushes = asyncio.gather(push(mine, "held"), push(theirs, "beside"), return_exceptions=True)
            await asyncio.to_thread(wait_until, lambda: waiting(cluster.node_of(mine)), 5, "the WAIT on its node")
            resumed = time.monotonic()
            resume(lagging)
            answers = await asyncio.wait_for(pushes, 5)
        return answers, resumed, min(pushed)

    answers, resumed, first_answered = asyncio.run(both())
    assert answers == [[1, b"held"], [1, b"beside"]] and first_answered > resumed
    assert reading(lagging).lrange(mine, 0, -1) == [b"held"]
    assert reading(replica_of(cluster, theirs)).lrange(theirs, 0, -1) == [b"beside"]

    async def refused_on_its_node_only() -> list:
        return await asyncio.wait_for(asyncio.gather(outbox.push([mine], ["refused"]),
                                                     outbox.push([theirs], ["beside again"]),
                                                     return_exceptions=True), 10)

    with stopped(lagging):  # for good this time
        refused, beside = asyncio.run(refused_on_its_node_only())
    assert isinstance(refused, NotReplicated) and beside == [2, b"beside again"]


def test_on_a_cluster_a_bulk_job_is_accepted_once_the_replicas_of_both_its_nodes_hold_it(replicated_cluster):
    """The record is in its job's slot, the items and the Idempotency-Key in the model's: each node's
    replica must hold its part before the 202; with one of them stopped the submit is refused and
    undone."""
    cluster, keys = replicated_cluster, Keys(cluster=True)
    store = JobStore(connect(cluster.url, socket_timeout=5), keys, ttl_s=60, replicas=1)
    bulk = keys.bulk(MODEL)
    model_node, items_replica = cluster.node_of(bulk), replica_of(cluster, bulk)

    def job_elsewhere() -> str:  # a job whose record is on another node than its items
        return next(job_id for job_id in iter(jobs.new_job_id, None)
                    if cluster.node_of(keys.job(job_id)) is not model_node)

    def submit(job_id: str, key: str) -> jobs.Record:
        payloads = store.item_payloads(job_id, MODEL, now_ms(), [(item, None) for item in INPUTS])
        return store.create(job_id, MODEL, now_ms(), payloads, f"sha-{key}", idempotency_key=key,
                            caller=jobs.Caller.anyone())[0]

    job_id = job_elsewhere()
    job_node, record_replica = cluster.node_of(keys.job(job_id)), replica_of(cluster, keys.job(job_id))
    with stopped(record_replica, items_replica), ThreadPoolExecutor(1) as pool:
        submitting = pool.submit(submit, job_id, "kept")
        wait_until(lambda: waiting(job_node), 5, "the WAIT on the record's node")
        resume(record_replica)
        wait_until(lambda: waiting(model_node), 5, "the WAIT on the items' node")
        resume(items_replica)
        assert submitting.result(timeout=5).id == job_id
    assert reading(record_replica).exists(keys.job(job_id))
    assert queued_ids(reading(items_replica), bulk) == [jobs.item_id(job_id, 0)]

    refused_id = job_elsewhere()
    started = time.monotonic()
    with stopped(items_replica), pytest.raises(NotReplicated):
        submit(refused_id, "refused")
    assert time.monotonic() - started < 2 * WAIT_S + 2
    assert not redis.Redis(port=cluster.node_of(keys.job(refused_id)).port).exists(keys.job(refused_id))
    assert store.replay(MODEL, "refused", "sha-refused", jobs.Caller.anyone()) is None  # its key undone too


def test_on_a_cluster_a_push_follows_its_node_failing_over(replicated_cluster):
    """A push's pipeline goes to its node's own client, past the cluster client's redirections: one
    to a primary that died fails (503) and has the client learn the slots again; then pushes go to
    the promoted replica, accepted once it has a replica of its own (the old primary, rejoined).
    Last in the module: it leaves the cluster's roles swapped."""
    cluster, keys = replicated_cluster, Keys(cluster=True)
    client = connect(cluster.url, socket_timeout=5)
    outbox = Outbox(client, client.register_script("return redis.call('LPUSH', KEYS[1], ARGV[1])"),
                    cluster=True, replicas=1)
    key = keys.queue(MODEL, 2)  # a list no other test of the module wrote

    def push(job: str):
        return asyncio.run(asyncio.wait_for(outbox.push([key], [job]), 10))

    assert push("before") == 1
    killed, promoted = cluster.kill_primary_of(key)
    with pytest.raises(redis.ConnectionError):
        push("to the dead node")
    with pytest.raises(NotReplicated):  # on the promoted replica, which has no replica yet
        push("unreplicated")
    cluster.rejoin(killed)
    assert push("after") == 3 and reading(killed).lrange(key, 0, -1)[0] == b"after"

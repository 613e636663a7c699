"""web/queueing/outbox.py against a real Redis: each push gets its own script answer, one round
trip per turn of the event loop, on the loop's own thread; with replicas to wait for, on the
outbox's thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from funnel.common.bulk.job_store import REPLICA_WAIT_MS
from funnel.common.errors import NotReplicated
from funnel.common.link.connection import connect
from funnel.common.link.line import Line
from funnel.scripts.redis_local import free_port, wait_until
from funnel.web.queueing.outbox import Outbox
from tests.cutting_proxy import CuttingProxy

# Push ARGV[1] onto KEYS[1] and answer the new length and the argument back.
SCRIPT = "return {redis.call('LPUSH', KEYS[1], ARGV[1]), ARGV[1]}"


def test_the_pushes_of_one_loop_turn_share_one_round_trip(redis_client):
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT))
    redis_client.script_load(SCRIPT)  # loaded already, as after a process's first push
    rounds: list[int] = []
    run = outbox._run
    outbox._run = lambda batch: rounds.append(len(batch)) or run(batch)  # type: ignore[method-assign]

    async def pushes():
        return await asyncio.gather(*(outbox.push([f"q{n % 3}"], [f"job-{n}"]) for n in range(60)))

    threads = threading.active_count()
    answers = asyncio.run(pushes())
    assert [a[1] for a in answers] == [f"job-{n}".encode() for n in range(60)]  # each its own answer
    assert rounds == [60]
    assert outbox._sender is None and threading.active_count() == threads  # no replicas: no thread of its own
    # Lengths per list are 1..20 each: every push ran once, atomically.
    for i in range(3):
        assert sorted(a[0] for n, a in enumerate(answers) if n % 3 == i) == list(range(1, 21))


@pytest.mark.parametrize("cluster", [False, True], ids=["one-round-trip", "by-node"])
def test_a_forgotten_script_a_script_error_and_a_dead_redis_reach_the_caller(redis_client, cluster):
    """Both transports: the loop's own connection, and a line to each node (as on a Redis Cluster)."""
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT), cluster=cluster)
    assert asyncio.run(outbox.push(["q"], ["a"]))[0] == 1
    redis_client.script_flush()  # as a restarted Redis would have it
    assert asyncio.run(outbox.push(["q"], ["b"])) == [2, b"b"]
    failing = Outbox(redis_client, redis_client.register_script("return redis.call('INCR', KEYS[1])"),
                     cluster=cluster)
    redis_client.set("text", "not a number")

    async def both():  # one turn: the failing push does not fail its neighbour
        return await asyncio.gather(failing.push(["text"], []), failing.push(["counter"], []),
                                    return_exceptions=True)

    error, counted = asyncio.run(both())
    assert isinstance(error, redis.ResponseError) and counted == 1
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        asyncio.run(Outbox(dead, dead.register_script(SCRIPT), cluster=cluster).push(["q"], ["a"]))


def test_with_replicas_a_wait_runs_off_the_loop_and_the_pushes_behind_it_go_together(redis_client):
    """A Redis with no replica: each round trip's WAIT runs out its time and answers 0, so every push
    that wrote is NotReplicated, and one the script says wrote nothing keeps its answer. Pushes made
    on later turns while a WAIT holds the sender's round trip go in its next, together."""
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT), replicas=1,
                    wrote=lambda answer: answer[1] != b"refused")
    redis_client.script_load(SCRIPT)
    rounds: list[int] = []
    run = outbox._run
    outbox._run = lambda batch: rounds.append(len(batch)) or run(batch)  # type: ignore[method-assign]

    def waiting() -> bool:
        return any(client.get("cmd") == "wait" for client in redis_client.client_list())

    async def pushes() -> tuple[list, float]:
        started = time.monotonic()
        first = asyncio.ensure_future(outbox.push(["q"], ["first"]))
        await asyncio.to_thread(wait_until, waiting, 5, "the first round trip's WAIT")
        behind = []
        for job in ("second", "refused", "third"):  # each on a turn of its own
            behind.append(asyncio.ensure_future(outbox.push(["q"], [job])))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        handed_s = time.monotonic() - started
        return await asyncio.gather(first, *behind, return_exceptions=True), handed_s

    answers, handed_s = asyncio.run(pushes())
    assert handed_s < REPLICA_WAIT_MS / 1000  # the loop went on while the WAIT held the first round trip
    assert rounds == [1, 3]
    assert [type(a) for a in answers] == [NotReplicated, NotReplicated, list, NotReplicated]
    assert answers[2] == [3, b"refused"] and answers[0].code == "not_replicated"
    assert redis_client.lrange("q", 0, -1) == [b"third", b"refused", b"second", b"first"]  # pushed all the same


def test_a_push_whose_answer_is_lost_is_not_sent_again(redis_server):
    """The client retries a connection error once (common/link/connection.py); a push's round trip is not
    sent again once written, since the failed one may have run: its jobs would be queued twice."""
    proxy = CuttingProxy(redis_server.port)
    client = connect(f"redis://127.0.0.1:{proxy.port}", socket_timeout=3)
    direct = redis.Redis(port=redis_server.port)
    direct.flushall()
    try:
        outbox = Outbox(client, client.register_script(SCRIPT))
        assert asyncio.run(outbox.push(["q"], ["first"]))[0] == 1  # connected, the script loaded
        proxy.arm()
        with pytest.raises(redis.ConnectionError):
            asyncio.run(outbox.push(["q"], ["second"]))
        assert direct.lrange("q", 0, -1) == [b"second", b"first"]  # it ran, once
        assert asyncio.run(outbox.push(["q"], ["third"]))[0] == 3  # a fresh connection for the next
        # What the outbox is kept from: a line that sends again runs a lost answer's command twice.
        line = Line(client)
        assert line.exchange([("PING",)]) == [b"PONG"]  # connected
        proxy.arm()
        assert line.exchange([("LPUSH", "r", "x")]) == [2]
        assert direct.llen("r") == 2
    finally:
        client.close()
        proxy.close()

"""web/queueing/outbox.py against a real Redis: each push gets its own script answer, one round
trip per turn of the event loop."""

from __future__ import annotations

import asyncio

import pytest
import redis

from funnel.scripts.redis_local import free_port
from funnel.web.queueing.outbox import Outbox

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

    answers = asyncio.run(pushes())
    assert [a[1] for a in answers] == [f"job-{n}".encode() for n in range(60)]  # each its own answer
    assert rounds == [60]
    # Lengths per list are 1..20 each: every push ran once, atomically.
    for i in range(3):
        assert sorted(a[0] for n, a in enumerate(answers) if n % 3 == i) == list(range(1, 21))


@pytest.mark.parametrize("cluster", [False, True], ids=["one-round-trip", "one-call-each"])
def test_a_forgotten_script_a_script_error_and_a_dead_redis_reach_the_caller(redis_client, cluster):
    """Both transports: the loop's own connection, and a call per push (as on a Redis Cluster)."""
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

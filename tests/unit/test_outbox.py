"""web/outbox.py against a real Redis: each push gets its own script answer, in shared round trips."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from funnel.scripts.redis_local import free_port
from funnel.web.outbox import Outbox

# Push ARGV[1] onto KEYS[1] and answer the new length and the argument back.
SCRIPT = "return {redis.call('LPUSH', KEYS[1], ARGV[1]), ARGV[1]}"


def test_concurrent_pushes_each_get_their_own_answer(redis_client):
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT))
    answers: dict[int, list] = {}

    def push(n):
        answers[n] = outbox.push([f"q{n % 3}"], [f"job-{n}"], timeout_s=10)

    threads = [threading.Thread(target=push, args=(n,)) for n in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(answers) == list(range(60))
    assert all(answers[n][1] == f"job-{n}".encode() for n in answers)  # nobody got another's answer
    assert sum(redis_client.llen(f"q{i}") for i in range(3)) == 60
    # Lengths per list are 1..20 each: every push ran once, atomically.
    for i in range(3):
        assert sorted(a[0] for n, a in answers.items() if n % 3 == i) == list(range(1, 21))


def test_a_forgotten_script_is_loaded_again(redis_client):
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT))
    assert outbox.push(["q"], ["a"], timeout_s=10)[0] == 1
    redis_client.script_flush()  # as a restarted Redis would have it
    assert outbox.push(["q"], ["b"], timeout_s=10) == [2, b"b"]


def test_a_script_error_and_a_dead_redis_reach_the_caller(redis_client):
    outbox = Outbox(redis_client, redis_client.register_script("return redis.call('INCR', KEYS[1])"))
    redis_client.set("text", "not a number")
    with pytest.raises(redis.ResponseError):
        outbox.push(["text"], [], timeout_s=10)
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    outbox = Outbox(dead, dead.register_script(SCRIPT))
    with pytest.raises(redis.ConnectionError):
        outbox.push(["q"], ["a"], timeout_s=10)


def test_the_pushes_of_one_loop_tick_share_one_round_trip(redis_client):
    """web/asgi.py's requests push on the event loop: no sender thread, one pipeline per tick."""
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT))
    rounds: list[int] = []
    run = outbox._run
    outbox._run = lambda batch: rounds.append(len(batch)) or run(batch)  # type: ignore[method-assign]

    async def pushes():
        return await asyncio.gather(*(outbox.push_async([f"q{n % 3}"], [f"job-{n}"]) for n in range(60)))

    answers = asyncio.run(pushes())
    assert [a[1] for a in answers] == [f"job-{n}".encode() for n in range(60)]  # each its own answer
    assert rounds == [60]
    for i in range(3):
        assert sorted(a[0] for n, a in enumerate(answers) if n % 3 == i) == list(range(1, 21))


def test_on_the_loop_a_forgotten_script_a_script_error_and_a_dead_redis_reach_the_caller(redis_client):
    outbox = Outbox(redis_client, redis_client.register_script(SCRIPT))
    assert asyncio.run(outbox.push_async(["q"], ["a"]))[0] == 1
    redis_client.script_flush()
    assert asyncio.run(outbox.push_async(["q"], ["b"])) == [2, b"b"]
    failing = Outbox(redis_client, redis_client.register_script("return redis.call('INCR', KEYS[1])"))
    redis_client.set("text", "not a number")
    with pytest.raises(redis.ResponseError):
        asyncio.run(failing.push_async(["text"], []))
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        asyncio.run(Outbox(dead, dead.register_script(SCRIPT)).push_async(["q"], ["a"]))

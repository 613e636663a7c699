"""The web process's shared reply inbox, against a real Redis: replies pushed as a worker pushes them."""

import asyncio

import pytest
import redis
from redis.crc import key_slot

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, encode_reply, now_ms
from funnel.common.errors import Timeout, Unavailable
from funnel.scripts.redis_local import LocalRedis, wait_until
from funnel.web.queueing.inbox import Inbox

M, OTHER = "text-embedding", "image-classifier"


@pytest.fixture()
def inbox(redis_client, keys):
    opened = Inbox(redis_client, keys)
    yield opened
    opened.close()


def reply(job_id: str, value: int) -> bytes:
    return encode_reply(Reply(id=job_id, ok=True, outputs={"value": value}, worker="w", batch_size=1))


def test_each_model_has_its_own_list_in_its_own_slot(redis_client, inbox, keys):
    """A worker's reply MULTI writes the inbox with its model's in-flight list: same hash slot."""

    async def both():
        mine, theirs = inbox.expect(M, ["t1"]), inbox.expect(OTHER, ["i1"])
        assert inbox.key(M) != inbox.key(OTHER)
        assert key_slot(inbox.key(M).encode()) == key_slot(keys.inflight(M, "w1").encode())
        assert key_slot(inbox.key(OTHER).encode()) == key_slot(keys.queue(OTHER).encode())
        redis_client.lpush(inbox.key(OTHER), reply("i1", 2))
        redis_client.lpush(inbox.key(M), reply("t1", 1))
        deadline = now_ms() + 10_000
        return await inbox.collect(mine, ["t1"], deadline), await inbox.collect(theirs, ["i1"], deadline)

    got_mine, got_theirs = asyncio.run(both())
    assert got_mine[0].outputs["value"] == 1 and got_theirs[0].outputs["value"] == 2


def test_late_duplicate_unknown_and_garbled_replies_are_dropped_and_counted(redis_client, keys):
    unclaimed = []
    inbox = Inbox(redis_client, keys, on_unclaimed=lambda: unclaimed.append(1))

    async def answers():
        inbox.expect(M, ["late"])
        inbox.forget(["late"])  # its request hit the deadline and left
        waiter, other = inbox.expect(M, ["mine"]), inbox.expect(M, ["next"])
        redis_client.lpush(inbox.key(M), reply("late", 1), reply("nobody", 2), b"\x00 not msgpack",
                           reply("mine", 3))
        [got] = await inbox.collect(waiter, ["mine"], now_ms() + 10_000)
        redis_client.lpush(inbox.key(M), reply("mine", 4), reply("next", 5))  # "mine" answered twice
        [got_next] = await inbox.collect(other, ["next"], now_ms() + 10_000)
        return got, got_next

    try:
        got, got_next = asyncio.run(answers())
    finally:
        inbox.close()
    assert got.outputs["value"] == 3 and got_next.outputs["value"] == 5
    assert len(unclaimed) == 3  # late, nobody, the second "mine"; the garbled one is only logged
    assert redis_client.llen(inbox.key(M)) == 0  # all taken: nothing piles up


def test_replies_pushed_together_reach_their_own_requests_in_order(redis_client, inbox):
    """Requests wait on the event loop; the listener thread wakes them."""
    first, second = ["c1", "c2", "c3"], ["d1"]

    async def both():
        waiters = [inbox.expect(M, ids) for ids in (first, second)]
        redis_client.lpush(inbox.key(M), reply("c3", 2), reply("d1", 9), reply("c1", 0))
        redis_client.lpush(inbox.key(M), reply("c2", 1))  # in a later round trip of the listener
        deadline = now_ms() + 10_000
        return await asyncio.gather(*(inbox.collect(w, ids, deadline)
                                      for w, ids in zip(waiters, (first, second))))

    got_first, got_second = asyncio.run(both())
    assert [r.id for r in got_first] == first and [r.outputs["value"] for r in got_first] == [0, 1, 2]
    assert [r.outputs["value"] for r in got_second] == [9]


def test_no_reply_by_the_deadline_is_a_timeout_and_a_late_one_is_dropped(redis_client, keys):
    unclaimed = []
    inbox = Inbox(redis_client, keys, on_unclaimed=lambda: unclaimed.append(1))

    async def slow():
        waiter = inbox.expect(M, ["late"])
        try:
            await inbox.collect(waiter, ["late"], now_ms() + 200)
        finally:
            inbox.forget(["late"])

    try:
        with pytest.raises(Timeout):
            asyncio.run(slow())
        redis_client.lpush(inbox.key(M), reply("late", 1))
        wait_until(lambda: unclaimed == [1], 10, "the late reply dropped")
    finally:
        inbox.close()


def test_redis_going_away_fails_the_waiting_requests():
    server = LocalRedis().start()

    async def stranded(inbox):
        waiter = inbox.expect(M, ["stranded"])
        server.stop()
        await inbox.collect(waiter, ["stranded"], now_ms() + 20_000)

    try:
        inbox = Inbox(redis.Redis.from_url(server.url, socket_timeout=5), Keys("funnel"))
        with pytest.raises(Unavailable):
            asyncio.run(stranded(inbox))
    finally:
        server.stop()
        inbox.close()


def test_every_borrower_that_learns_its_job_late_gets_its_reply(redis_client, inbox):
    """Requests of this process borrowing one job (web/queueing/cache_plan.py), whose push scripts ran before
    its reply came but who ask for it after: each gets it, not only the first to ask."""

    async def late_borrowers():
        inbox.lending = True  # a cached model's request ran in this process
        own = inbox.expect(M, ["lent"])
        redis_client.lpush(inbox.key(M), reply("lent", 7))
        [mine] = await inbox.collect(own, ["lent"], now_ms() + 10_000)
        borrowers = [inbox.borrow(M, ["lent"]) for _ in range(3)]
        try:
            return mine, await asyncio.wait_for(asyncio.gather(*(w.future for w in borrowers)), 5)
        finally:
            for waiter in borrowers:
                inbox.give_back(["lent"], waiter)

    mine, borrowed = asyncio.run(late_borrowers())
    assert mine.outputs["value"] == 7
    assert [[r.outputs["value"] for r in got] for got in borrowed] == [[7], [7], [7]]

"""Priority lanes against a real Redis: how a push picks its queue, how a take fills a batch from
the lanes with floor shares, and how the names clients send are read."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from funnel.common.contracts import priority
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Job, decode_job, encode_job, now_ms
from funnel.common.errors import BadInput
from funnel.common.link import lua_scripts
from funnel.web.queueing import push_script
from funnel.web.queueing.limits import parse as parse_limits
from funnel.worker import queue as worker_queue
from funnel.worker.lanes import Shares
from funnel.worker.linger import Linger
from funnel.worker.queue import JobQueue
from tests.support import wait_for
from tests.unit.test_jobs import item, make_job

MODEL = "m"


def job(lane: str, n: int) -> bytes:
    return encode_job(Job(id=f"{lane}-{n}", model=MODEL, items=[{"x": np.zeros(1, np.int32)}], reply_to="r",
                          deadline=now_ms() + 60_000, priority="" if lane == priority.NORMAL else lane))


def push(redis_client, keys: Keys, lane: str, jobs: list[bytes], max_queue: int = 0) -> list:
    script = lua_scripts.register(redis_client, "push")
    call = push_script.PushCall(model=MODEL, version=1, lane=lane, jobs=jobs, max_queue=max_queue, budget_s=10,
                                token="t")
    return script(keys=call.keys(keys), args=call.args())


@pytest.mark.parametrize(("value", "lane"), [
    (None, "normal"), ("", "normal"), ("high", "high"), (" LOW ", "low"), ("Normal", "normal"),
    (1, "high"), (0, "normal"), (2, "normal"), (3, "low"), (7, "low"), ("1", "high"), ("3", "low")])
def test_clients_name_a_lane_or_tritons_number(value, lane):
    assert priority.parse(value) == lane


@pytest.mark.parametrize("value", ["urgent", "-1", -1, True, 1.5, "9" * 40, [1], {}])
def test_anything_else_is_a_400(value):
    with pytest.raises(BadInput) as raised:
        priority.parse(value)
    assert raised.value.code == "bad_priority" and len(raised.value.message) < 120


def test_a_key_may_be_held_below_high():
    limits = parse_limits('{"basic": {"priority": "normal"}, "*": {"priority": "low"}, "vip": {"rate": 5}}')
    assert limits["basic"].priority == "normal" and limits["vip"].priority == "high"
    assert priority.at_most("high", limits["basic"].priority) == "normal"
    assert priority.at_most("low", limits["basic"].priority) == "low"
    with pytest.raises(ValueError, match="priority must be one of"):
        parse_limits('{"x": {"priority": "urgent"}}')


def test_with_every_lane_empty_a_request_goes_to_the_normal_queue(redis_client, keys):
    assert push(redis_client, keys, "high", [job("high", 0)])[0] == 1
    assert redis_client.llen(keys.queue(MODEL)) == 1  # an idle worker blocks there
    push(redis_client, keys, "high", [job("high", 1)])
    push(redis_client, keys, "low", [job("low", 0)])
    assert [redis_client.llen(keys.queue(MODEL, 1, lane)) for lane in priority.LANES] == [1, 1, 1]


def test_the_queue_limit_turns_a_low_request_away_first(redis_client, keys):
    push(redis_client, keys, "normal", [job("normal", n) for n in range(3)], max_queue=3)
    assert push(redis_client, keys, "low", [job("low", 0)], max_queue=3)[:2] == [0, 3]
    assert push(redis_client, keys, "normal", [job("normal", 9)], max_queue=3)[:2] == [0, 3]
    assert push(redis_client, keys, "high", [job("high", 0)], max_queue=3)[0] == 1  # nothing ahead of it


def test_a_batch_takes_high_first_and_every_lane_its_floor_share(redis_client, keys):
    for lane in priority.LANES:
        redis_client.lpush(keys.queue(MODEL, 1, lane), *[job(lane, n) for n in range(100)])
    bulk_job = make_job(redis_client, keys, 100)
    redis_client.lpush(keys.bulk(MODEL), *[item(keys, bulk_job, i) for i in range(100)])
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1", bulk_share=0.25)
    served = {"high": 0, "normal": 0, "low": 0, "bulk": 0}
    for _ in range(10):
        taken = queue.take(10, Linger(0), 0.1).jobs
        assert len(taken) == 10
        for raw in taken:
            lane = "bulk" if keys.job(bulk_job).encode() in raw else decode_job(raw).priority or "normal"
            served[lane] += 1
        redis_client.delete(keys.inflight(MODEL, "w1"))  # answered, as a reply would
        queue.forget(len(taken))
    # Floors: normal 0.2, low 0.1, bulk 0.25 of the places; high the rest.
    assert served == {"high": 45, "normal": 20, "low": 10, "bulk": 25}, served
    # Oldest first within a lane.
    first_high = [decode_job(raw).id for raw in redis_client.lrange(keys.queue(MODEL, 1, "high"), -3, -1)]
    assert first_high == ["high-47", "high-46", "high-45"]


def test_floor_shares_hold_with_batches_of_one():
    shares = Shares([0.0, 0.2, 0.1, 0.25])
    served = [0, 0, 0, 0]
    for _ in range(400):  # every lane backlogged: the take gives each reserved place, lowest lane first
        places, left, taken = shares.reserve(1), 1, [0, 0, 0, 0]
        for lane in (3, 2, 1):
            taken[lane] = min(places[lane], left)
            left -= taken[lane]
        taken[0] = left
        shares.spend(taken, 1)
        served = [a + b for a, b in zip(served, taken)]
    assert served[1] >= 0.8 * 0.2 * 400 and served[2] >= 0.8 * 0.1 * 400 and served[3] >= 0.8 * 0.25 * 400
    assert served[0] >= 0.3 * 400, served


def test_high_jobs_left_behind_an_empty_normal_queue_wake_an_idle_worker(redis_client, keys):
    redis_client.lpush(keys.queue(MODEL, 1, "high"), *[job("high", n) for n in range(3)])
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    assert len(queue.take(2, Linger(0), 0.1).jobs) == 2
    # One moved to where idle workers block: another worker's BLMOVE takes it at once.
    assert redis_client.llen(keys.queue(MODEL)) == 1 and redis_client.llen(keys.queue(MODEL, 1, "high")) == 0
    other = JobQueue(redis_client, keys, model=MODEL, worker_id="w2")
    queue._interactive_at -= worker_queue.INTERACTIVE_RECENT_S
    assert [decode_job(raw).id for raw in other.take(4, Linger(0), 0.1).jobs] == ["high-2"]


def test_while_an_older_worker_serves_a_version_its_requests_are_served_as_normal():
    from funnel.web.queueing.shedding import capacity

    new = {"id": "w-new", "model": MODEL, "version": "1", "lanes": "1"}
    old = {"id": "w-old", "model": MODEL, "version": "1"}  # before the lanes: takes the normal queue only
    assert capacity([new], MODEL).lanes and capacity([], MODEL).lanes
    assert not capacity([new, old], MODEL).lanes
    assert capacity([new, {**old, "version": "2"}], MODEL).lanes  # another version's workers do not count


def several(lane: str, n: int, count: int) -> bytes:
    return encode_job(Job(id=f"{lane}-{n}", model=MODEL, items=[{"x": np.full(1, i, np.int32)} for i in range(count)],
                          reply_to="r", deadline=now_ms() + 60_000, priority="" if lane == priority.NORMAL else lane))


@pytest.mark.parametrize("count", [2, 127, 128, 300])  # msgpack's fixint, uint8 and uint16 counts
def test_a_take_counts_items_as_the_message_says(redis_client, keys, count):
    redis_client.lpush(keys.queue(MODEL), several("normal", 0, count), job("normal", 1))
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    taken = queue.take(count + 1, Linger(0), 0.1).jobs  # room for both: the job's items and the one behind it
    assert [decode_job(raw).id for raw in taken] == ["normal-0", "normal-1"]


def test_a_lane_takes_jobs_while_it_has_room_so_a_batch_overruns_by_less_than_a_job(redis_client, keys):
    normal = keys.queue(MODEL)
    redis_client.lpush(normal, job("normal", 0), several("normal", 1, 8), several("normal", 2, 3),
                       several("normal", 3, 10), job("normal", 4))
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")

    def take(size: int) -> list[str]:
        taken = queue.take(size, Linger(0), 0.1).jobs
        redis_client.delete(keys.inflight(MODEL, "w1"))
        queue.forget(len(taken))
        return [decode_job(raw).id for raw in taken]

    assert take(10) == ["normal-0", "normal-1", "normal-2"]  # 12 items: room was left for the third
    assert take(10) == ["normal-3"]  # exactly full
    assert take(10) == ["normal-4"]
    assert redis_client.llen(normal) == 0


def test_floor_shares_count_items_and_a_big_job_in_high_does_not_starve_the_lanes_below(redis_client, keys):
    for n in range(40):
        redis_client.lpush(keys.queue(MODEL, 1, "high"), several("high", n, 10))
        redis_client.lpush(keys.queue(MODEL, 1, "normal"), several("normal", n, 10))
        redis_client.lpush(keys.queue(MODEL, 1, "low"), job("low", n))
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    items = {"high": 0, "normal": 0, "low": 0}
    for _ in range(20):
        taken = queue.take(10, Linger(0), 0.1).jobs
        for raw in taken:
            decoded = decode_job(raw)
            items[decoded.priority or "normal"] += len(decoded.items)
        redis_client.delete(keys.inflight(MODEL, "w1"))
        queue.forget(len(taken))
    assert items["high"] >= 80 and items["normal"] >= 20 and items["low"] >= 10, items


def test_the_take_drops_jobs_whose_client_left_unrun_and_forgets_their_marks(redis_client, keys):
    from funnel.common.contracts.wire import encode_job as encode

    leave = lua_scripts.register(redis_client, "leave")
    normal = keys.queue(MODEL)
    long_id = Job(id="x" * 40, model=MODEL, items=[{"x": np.zeros(1, np.int32)}] * 3, reply_to="r",
                  deadline=now_ms() + 60_000)  # a str 8 id, in a job of several items
    redis_client.lpush(normal, job("normal", 0), several("normal", 1, 4), encode(long_id), job("normal", 3))
    leave(keys=[keys.gone(MODEL)], args=[now_ms(), now_ms() + 60_000, "normal-1", "x" * 40, "elsewhere"])
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    taken = queue.take(10, Linger(0), 0.1)
    assert [decode_job(raw).id for raw in taken.jobs] == ["normal-0", "normal-3"] and taken.left == 2
    assert redis_client.lrange(keys.inflight(MODEL, "w1"), 0, -1)[::-1] == taken.jobs  # the dropped are not held
    assert redis_client.zrange(keys.gone(MODEL), 0, -1) == [b"elsewhere"]  # their marks forgotten


def test_a_job_an_idle_worker_blocked_for_and_leftovers_are_dropped_when_their_client_left(redis_client, keys):
    """The jobs the take script does not move itself: the one an idle worker's BLMOVE takes, and
    those left in its in-flight list from before a restart, are checked against the gone set too."""
    import threading

    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    queue.take(4, Linger(0), 0.01)  # no leftovers: the next take blocks
    taken: list = []
    waiting = threading.Thread(target=lambda: taken.append(queue.take(4, Linger(0), 5.0)))
    waiting.start()
    wait_for(lambda: any("blmove" in c.get("cmd", "") for c in redis_client.client_list()), timeout_s=5,
             interval_s=0.01, what="the worker blocked on its queue")
    marked = redis_client.pipeline(transaction=True)  # the job and its mark reach the blocked worker at once
    marked.lpush(keys.queue(MODEL), job("normal", 0))
    marked.zadd(keys.gone(MODEL), {"normal-0": now_ms() + 60_000})
    marked.execute()
    waiting.join(10)
    assert taken[0].jobs == [] and taken[0].left == 1
    assert redis_client.llen(keys.inflight(MODEL, "w1")) == 0 and redis_client.zcard(keys.gone(MODEL)) == 0

    # A restart under the same id finds two jobs in its in-flight list, one of them left by its client.
    redis_client.lpush(keys.inflight(MODEL, "w2"), job("normal", 1), job("normal", 2))
    redis_client.zadd(keys.gone(MODEL), {"normal-2": now_ms() + 60_000})
    restarted = JobQueue(redis_client, keys, model=MODEL, worker_id="w2")
    after = restarted.take(4, Linger(0), 0.1)
    assert [decode_job(raw).id for raw in after.jobs] == ["normal-1"]
    assert after.left == 1 and redis_client.zcard(keys.gone(MODEL)) == 0
    assert [decode_job(raw).id for raw in redis_client.lrange(keys.inflight(MODEL, "w2"), 0, -1)] == ["normal-1"]


SHORT = [b"", b"\x81", b"\x81\xa1v\x01", b"\x81\xa1v\x01\xa1n", b"\x81\xa1v\x01\xa1n\xcc",
         b"\x81\xa1v\x01\xa1n\xcd\x00", b"\x81\xa1v\x01\xa1n\x00",
         b"\x81\xa1v\x01\xa1n\xcc\x00", b"\x83\xa1v\x01\xa2id\xd9", b"\xde\x00"]


def test_short_or_hand_pushed_messages_count_one_item_at_least_and_never_break_the_take(redis_client, keys):
    """What redis-cli can push: the take counts each as one item at least (never zero, so a batch
    stays bounded), the worker's own count agrees, and decoding later dead-letters them."""
    from funnel.common.contracts.wire import item_count

    assert [item_count(raw) for raw in SHORT] == [1] * len(SHORT)
    leave = lua_scripts.register(redis_client, "leave")
    leave(keys=[keys.gone(MODEL)], args=[now_ms(), now_ms() + 60_000, "someone"])  # ids are looked up
    redis_client.lpush(keys.queue(MODEL), *SHORT, job("normal", 0))
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    first = queue.take(4, Linger(0), 0.1)
    assert first.jobs == SHORT[:4]  # four messages, one item each: oldest first
    rest = queue.take(100, Linger(0), 0.1)
    assert len(first.jobs + rest.jobs) == len(SHORT) + 1 and first.left == rest.left == 0


def take_scripts(redis_client) -> int:
    return sum(stats["calls"] for name, stats in redis_client.info("commandstats").items()
               if name in ("cmdstat_evalsha", "cmdstat_eval"))


@pytest.mark.parametrize("blocked", [False, True])
def test_a_batch_the_linger_will_not_wait_for_costs_one_take_script(redis_client, keys, blocked):
    """A batch that the linger runs at once costs one take script after the job is in hand (blocked: one
    before, which found the queues empty, and one after the wake): another right after the one that
    emptied the queues would find nothing."""
    queue = JobQueue(redis_client, keys, model=MODEL, worker_id="w1")
    queue.take(4, Linger(0), 0.01)  # the leftovers' check, once
    if blocked:
        threading.Timer(0.2, lambda: redis_client.lpush(keys.queue(MODEL), job("normal", 0))).start()
    else:
        redis_client.lpush(keys.queue(MODEL), job("normal", 0))
    before = take_scripts(redis_client)
    assert [decode_job(raw).id for raw in queue.take(4, Linger(0), 5).jobs] == ["normal-0"]
    assert take_scripts(redis_client) - before == (2 if blocked else 1)

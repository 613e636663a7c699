"""Answering a batch (worker/reply.py, common/link/lua/reply.lua) against a real Redis: a reply goes out
only while its job is still in the worker's hands."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.common.contracts.wire import HANDLE_BYTES, Job, Reply, decode_reply, encode_job, handle
from funnel.worker.reply import Replier, ReplyCall, sorted_replies

MODEL = "m"
IMAGE = 224 * 224 * 3  # an image's pixels: a long message, named in flight by its first bytes
SIZES = pytest.mark.parametrize("size", [1, IMAGE], ids=["short", "image"])


def taken(redis_client, keys, worker: str, n: int, size: int = 1
          ) -> tuple[list[bytes], list[str], list[tuple[str, Reply]]]:
    """n jobs as a worker holds them (in its in-flight list), and their replies: each item `size`
    bytes of the same pixels, so that long messages differ only in their ids."""
    inbox = keys.reply(MODEL, "web-1")
    jobs = [Job(id=f"job-{i}", model=MODEL, items=[{"x": np.zeros(size, np.uint8)}], reply_to=inbox,
                deadline=2**40) for i in range(n)]
    raws = [encode_job(job) for job in jobs]
    redis_client.lpush(keys.inflight(MODEL, worker), *raws)
    return raws, [j.id for j in jobs], [(inbox, Reply(id=j.id, ok=True, outputs={"y": 1})) for j in jobs]


@SIZES
def test_a_batch_still_held_is_answered_and_forgotten(redis_client, keys, size):
    raws, ids, replies = taken(redis_client, keys, "w1", 3, size)
    assert Replier(redis_client, keys, worker_id="w1", model=MODEL, ttl_s=60).answer(replies, [], raws, ids) == ids
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert sorted(pushed) == ids and redis_client.llen(keys.inflight(MODEL, "w1")) == 0
    assert 0 < redis_client.ttl(keys.reply(MODEL, "web-1")) <= 60


@SIZES
def test_jobs_recovered_while_the_worker_was_paused_are_not_answered_again(redis_client, keys, size):
    raws, ids, replies = taken(redis_client, keys, "w2", 3, size)
    # A peer found w2 dead (its heartbeat lapsed while it was paused) and requeued two of its jobs.
    for raw in raws[:2]:
        redis_client.lrem(keys.inflight(MODEL, "w2"), 1, raw)
        redis_client.lpush(keys.queue(MODEL), raw)
    replier = Replier(redis_client, keys, worker_id="w2", model=MODEL, ttl_s=60)
    assert replier.answer(replies, [raws[0]], raws, ids) == ids[2:]
    pushed = [decode_reply(r).id for r in redis_client.lrange(keys.reply(MODEL, "web-1"), 0, -1)]
    assert pushed == ids[2:]  # the requeued ones are their next worker's to answer
    assert redis_client.llen(keys.dead(MODEL)) == 0  # nor parked: it is no longer this worker's
    # The same answer again (its first EXEC's answer lost): nothing more goes out.
    assert Replier(redis_client, keys, worker_id="w2", model=MODEL, ttl_s=60).answer(replies, [], raws, ids) == []
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
    assert Replier(redis_client, keys, worker_id="w3", model="m", ttl_s=60).answer(replies, [], raws, ids) == ids[1:]
    assert sorted(redis_client.hkeys(results)) == [b"1", b"2"]  # item 0 is its next worker's to store
    record = redis_client.hgetall(keys.job(job_id))
    assert record[b"done"] == b"2" and record.get(b"duplicates", b"0") == b"0"
    assert redis_client.llen(keys.inflight("m", "w3")) == 0


def test_a_long_message_is_named_by_its_head_and_a_short_one_whole():
    raws = [encode_job(Job(id="a" * 32, model=MODEL, items=[{"x": np.zeros(size, np.uint8)}], reply_to="r",
                           deadline=1)) for size in (1, IMAGE)]
    assert handle(raws[0], "a" * 32) == raws[0]
    assert handle(raws[1], "a" * 32) == raws[1][:HANDLE_BYTES]
    assert handle(raws[1], "") == raws[1]  # no id to tell it from another: all of it
    assert handle(raws[1], "b" * 32) == raws[1]  # an id its head does not hold: all of it


def test_answering_images_sends_no_pixels_back(redis_client, keys):
    raws, ids, replies = taken(redis_client, keys, "w4", 16, IMAGE)
    replier = Replier(redis_client, keys, worker_id="w4", model=MODEL, ttl_s=60)
    by_job, by_id = sorted_replies(keys, replies)
    call = ReplyCall.of(replier, by_id, by_job, [], raws, ids)
    sent = sum(len(a) for a in call.args if isinstance(a, bytes))
    assert sent < sum(map(len, raws)) / 100, sent  # the handles and the replies: none of the pixels


def test_a_long_message_is_found_wherever_it_lies_and_parked_whole(redis_client, keys):
    inflight = keys.inflight(MODEL, "w5")
    raws, ids, replies = taken(redis_client, keys, "w5", 3, IMAGE)
    later, _, _ = taken(redis_client, keys, "w5", 2, IMAGE + 1)  # the next batch, taken while this one ran
    redis_client.rpush(inflight, raws[1])  # and job-1 moved to the old end: not where the batch's others lie
    redis_client.lrem(inflight, 1, raws[1])  # (the first copy of it, at the new end)
    replier = Replier(redis_client, keys, worker_id="w5", model=MODEL, ttl_s=60)
    assert replier.answer(replies, [raws[2]], raws, ids) == ids
    assert redis_client.lrange(inflight, 0, -1) == later[::-1]  # the next batch's, untouched
    assert redis_client.lrange(keys.dead(MODEL), 0, -1) == [raws[2]]  # the message as taken, every byte

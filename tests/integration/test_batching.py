"""The worker loop against a real redis-server: batch sizes, linger, reply keys, per-item errors."""

import time
import uuid
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest

from funnel.common import tasks
from funnel.common.contracts import wire
from funnel.common.contracts.wire import Job
from funnel.common.store import load_spec
from tests import toy_model
from tests.support import running_worker, wait_for

MODEL = "text-embedding"
PACED = "paced-score"  # tests/third_party/toyscore's PacedScore: every batch takes PACE_S, whatever its size
PACE_S = 0.1


@pytest.fixture(scope="module")
def spec(model_store):
    return load_spec(model_store, MODEL)


@pytest.fixture(scope="module")
def paced_store(tmp_path_factory):
    """A store holding the paced toy scorer, its task importable by the worker run in a thread."""
    store = tmp_path_factory.mktemp("paced-store")
    toy_model.add_paced(store, tmp_path_factory.mktemp("paced"), PACED, batch_s=PACE_S, batch_size=64)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(toy_model.PACKAGE_DIR))
        yield store


def text_job(spec, text, keys, deadline_s=30.0, **inputs) -> Job:
    job_id = uuid.uuid4().hex
    inputs = inputs or tasks.load(spec).preprocess(text)
    return Job(id=job_id, model=MODEL, items=[inputs], reply_to=keys.reply(MODEL, job_id),
               deadline=wire.now_ms() + int(deadline_s * 1000))


def vector_job(keys, vector) -> Job:
    job_id = uuid.uuid4().hex
    return Job(id=job_id, model=PACED, items=[{"vector": np.asarray(vector, np.float32)}],
               reply_to=keys.reply(PACED, job_id), deadline=wire.now_ms() + 30_000)


def push(client, keys, jobs):
    """LPUSH the jobs in one command: a worker's take finds them all queued at once."""
    client.lpush(keys.queue(jobs[0].model), *[wire.encode_job(j) for j in jobs])


def await_reply(client, job, timeout=30):
    got = client.blpop([job.reply_to], timeout=timeout)
    assert got is not None, f"no reply for {job.id}"
    reply = wire.decode_reply(got[1])
    assert reply.id == job.id
    return reply


def test_fifty_queued_jobs_run_as_16_16_16_2(redis_client, redis_server, model_store, spec, keys):
    jobs = [text_job(spec, f"sentence number {i}", keys) for i in range(50)]
    push(redis_client, keys, jobs)
    with running_worker(redis_server, model_store, batch_size=16, linger_ms=50):
        replies = [await_reply(redis_client, job) for job in jobs]
    assert all(r.ok for r in replies)
    assert {r.version for r in replies} == {1}  # the store's flat entry: version 1, named in every reply
    sizes = Counter(r.batch_size for r in replies)
    assert sizes == {16: 48, 2: 2}
    # Oldest first: the first 16 queued form the first batch.
    assert {r.batch_size for r in replies[:48]} == {16}
    assert redis_client.llen(keys.inflight(MODEL, "test-worker")) == 0
    assert redis_client.llen(keys.queue(MODEL)) == 0


@contextmanager
def paced_worker_expecting_more(client, server, store, keys, linger_ms):
    """A paced worker (batches of up to 64) that has learned what lingering pays for.

    Three bursts, each pushed in one command and so taken whole, run as batches
    of 16, 4 and 8: from their timings (three batches of two sizes at least) the
    worker fits a batch's fixed cost, PACE_S, and from their enqueue stamps it
    sees jobs arriving far faster than one per PACE_S. The policy then waits
    for more once it holds a job, bounded by linger_ms (63 more jobs at that
    rate would take longer). Arrivals count for two seconds, so the block must
    push its jobs promptly.
    """
    vectors = iter(toy_model.vectors(29, seed=1))
    with running_worker(server, store, model=PACED, linger_ms=linger_ms):
        assert_worker_registered(client, keys, PACED)
        for size in (16, 4, 8):
            burst = [vector_job(keys, next(vectors)) for _ in range(size)]
            push(client, keys, burst)
            assert {await_reply(client, job).batch_size for job in burst} == {size}
        yield next(vectors)


def test_a_single_job_waits_at_most_the_linger(redis_client, redis_server, paced_store, keys):
    with paced_worker_expecting_more(redis_client, redis_server, paced_store, keys, linger_ms=200) as vector:
        job = vector_job(keys, vector)
        push(redis_client, keys, [job])
        reply = await_reply(redis_client, job)
    assert reply.ok and reply.batch_size == 1
    np.testing.assert_allclose(reply.outputs["scores"], toy_model.expected_scores(np.array([vector]))[0],
                               atol=1e-5)
    # queue_ms: from its enqueue stamp to the batch's start, the take's wait included. It did
    # wait for company (the policy expected more), but the maximum linger cut the wait short.
    assert 0.19 <= reply.queue_ms / 1000 <= 0.2 + 0.15


def test_a_job_arriving_within_the_linger_joins_the_batch(redis_client, redis_server, paced_store, keys):
    with paced_worker_expecting_more(redis_client, redis_server, paced_store, keys, linger_ms=300) as vector:
        first, second = vector_job(keys, vector), vector_job(keys, [v + 1 for v in vector])
        push(redis_client, keys, [first])
        # The worker holds the first job (and waits for more) once it is in its in-flight list.
        wait_for(lambda: redis_client.llen(keys.inflight(PACED, "test-worker")) == 1, timeout_s=10,
                 interval_s=0.002, what="the first job taken")
        push(redis_client, keys, [second])
        replies = [await_reply(redis_client, first), await_reply(redis_client, second)]
    assert [(r.ok, r.batch_size) for r in replies] == [(True, 2), (True, 2)]
    assert 50 <= replies[0].queue_ms <= 300 + 150


def test_the_linger_does_not_make_a_lone_job_wait(redis_client, redis_server, model_store, spec, keys):
    """Without jobs arriving faster than merging them pays, a lone job never waits for company."""
    with running_worker(redis_server, model_store, batch_size=16, linger_ms=1000):
        assert_worker_registered(redis_client, keys)
        for text in ("one", "two", "three"):
            job = text_job(spec, text, keys)
            started = time.monotonic()
            push(redis_client, keys, [job])
            reply = await_reply(redis_client, job)
            assert reply.ok and reply.batch_size == 1
            assert time.monotonic() - started < 0.5  # far below the 1 s maximum linger


def batched_like_alone(client, server, store, spec, keys, texts, batch_size, linger_ms):
    """Send each text alone, then all at once; every batched answer must equal its solo one."""
    with running_worker(server, store, batch_size=batch_size, linger_ms=linger_ms):
        alone = {t: await_one(client, keys, spec, t) for t in texts}
        jobs = [text_job(spec, t, keys) for t in texts]
        push(client, keys, jobs)
        replies = [await_reply(client, job) for job in jobs]
    for text, reply in zip(texts, replies):
        np.testing.assert_allclose(reply.outputs["embedding"], alone[text], atol=1e-5)
    return replies


def test_replies_land_on_their_own_keys(redis_client, redis_server, model_store, spec, keys):
    texts = ["A man is eating food.", "The girl is carrying a baby.", "A cheetah runs.", "Red wine."]
    replies = batched_like_alone(redis_client, redis_server, model_store, spec, keys, texts, 8, 100)
    assert {r.batch_size for r in replies} == {4}
    assert not redis_client.keys(f"{keys.prefix}:reply:*")  # every reply consumed, none stray


def test_a_long_text_runs_apart_and_every_answer_stays_with_its_job(redis_client, redis_server,
                                                                    model_store, spec, keys):
    texts = [f"short text {i}" for i in range(15)] + ["word " * 250] + [f"tiny {i}" for i in range(16)]
    replies = batched_like_alone(redis_client, redis_server, model_store, spec, keys, texts, 32, 200)
    assert {r.batch_size for r in replies} == {32}


def await_one(client, keys, spec, text):
    job = text_job(spec, text, keys)
    push(client, keys, [job])
    return await_reply(client, job).outputs["embedding"]


def assert_worker_registered(client, keys, model=MODEL, timeout=30):
    wait_for(lambda: client.exists(keys.worker(model, "test-worker")), timeout_s=timeout, what="the worker registered")


def test_a_bad_item_fails_alone(redis_client, redis_server, model_store, spec, keys):
    good = [text_job(spec, f"good {i}", keys) for i in range(3)]
    bad = text_job(spec, None, keys, input_ids=np.array([1.5, 2.5], np.float32))
    out_of_vocab = text_job(spec, None, keys, input_ids=np.array([101, 999_999, 102], np.int32))
    push(redis_client, keys, [good[0], bad, good[1], out_of_vocab, good[2]])
    with running_worker(redis_server, model_store, batch_size=8, linger_ms=50):
        bad_reply = await_reply(redis_client, bad)
        oov_reply = await_reply(redis_client, out_of_vocab)
        good_replies = [await_reply(redis_client, job) for job in good]
    assert not bad_reply.ok and bad_reply.error["code"] == "bad_input"
    assert not oov_reply.ok and oov_reply.error["code"] == "bad_input"
    assert all(r.ok and r.batch_size == 3 for r in good_replies)


def test_garbage_goes_to_the_dead_letter_list(redis_client, redis_server, model_store, spec, keys):
    job = text_job(spec, "after the garbage", keys)
    redis_client.lpush(keys.queue(MODEL), b"\x00garbage", wire.encode_job(job))
    with running_worker(redis_server, model_store, batch_size=1, linger_ms=0):
        assert await_reply(redis_client, job).ok
    assert redis_client.lrange(keys.dead(MODEL), 0, -1) == [b"\x00garbage"]


def test_expired_jobs_are_dropped_unanswered(redis_client, redis_server, model_store, spec, keys):
    late = text_job(spec, "too late", keys, deadline_s=-1)
    fresh = text_job(spec, "in time", keys)
    push(redis_client, keys, [late, fresh])
    with running_worker(redis_server, model_store, batch_size=4, linger_ms=0):
        assert await_reply(redis_client, fresh).ok
    assert redis_client.llen(keys.queue(MODEL)) == 0  # taken with the fresh one...
    assert redis_client.llen(late.reply_to) == 0  # ...and dropped, not answered


def test_leftover_inflight_jobs_are_answered_on_restart(redis_client, redis_server, model_store,
                                                        spec, keys):
    """A worker restarted under the same id first finishes what it held."""
    job = text_job(spec, "held by a crashed worker", keys)
    redis_client.lpush(keys.inflight(MODEL, "test-worker"), wire.encode_job(job))
    with running_worker(redis_server, model_store, batch_size=4, linger_ms=0):
        assert await_reply(redis_client, job).ok
    assert redis_client.llen(keys.inflight(MODEL, "test-worker")) == 0


def several_job(spec, texts, keys, **bad) -> Job:
    """One job of several texts (a request's items, as the web sends them); bad: an item replaced, by index."""
    task = tasks.load(spec)
    items = [bad.get(f"item{i}") or task.preprocess(text) for i, text in enumerate(texts)]
    job_id = uuid.uuid4().hex
    return Job(id=job_id, model=MODEL, items=items, reply_to=keys.reply(MODEL, job_id),
               deadline=wire.now_ms() + 30_000)


def test_jobs_of_several_items_run_together_and_each_item_gets_its_own_answer(redis_client, redis_server,
                                                                             model_store, spec, keys):
    """Jobs of 5, 7 and 1 items and a job of 20, larger than the batch of 8 (run in parts): every
    item's answer equals the text's answered alone, in its job's order."""
    texts = [f"sentence number {i} of many" for i in range(33)]
    sizes, jobs, at = (5, 7, 1, 20), [], 0
    for size in sizes:
        jobs.append(several_job(spec, texts[at:at + size], keys))
        at += size
    with running_worker(redis_server, model_store, batch_size=8, linger_ms=50):
        alone = {text: await_one(redis_client, keys, spec, text) for text in texts}
        push(redis_client, keys, jobs)
        replies = [await_reply(redis_client, job) for job in jobs]
    at = 0
    for size, reply in zip(sizes, replies):
        assert reply.ok
        items = reply.each()
        assert len(items) == size and (reply.items is None) == (size == 1)
        for text, item in zip(texts[at:at + size], items):
            np.testing.assert_allclose(item.outputs["embedding"], alone[text], atol=1e-5)
        at += size
    # 5 + 7 overrun the batch of 8 by less than a job; 1 + 20 is the next batch, in parts of 8 at most.
    assert [r.batch_size for r in replies] == [12, 12, 21, 21]
    assert redis_client.llen(keys.inflight(MODEL, "test-worker")) == 0


def test_a_bad_item_fails_its_job_naming_the_item_and_no_other_job(redis_client, redis_server, model_store,
                                                                   spec, keys):
    good = several_job(spec, ["good one", "good two"], keys)
    bad = several_job(spec, ["fine", "fine too", "not fine"], keys,
                      item2={"input_ids": np.array([101, 999_999, 102], np.int32)})
    push(redis_client, keys, [good, bad])
    with running_worker(redis_server, model_store, batch_size=8, linger_ms=50):
        bad_reply, good_reply = await_reply(redis_client, bad), await_reply(redis_client, good)
    assert not bad_reply.ok and bad_reply.error["code"] == "bad_input" and bad_reply.item == 2
    assert good_reply.ok and len(good_reply.each()) == 2 and good_reply.batch_size == 2

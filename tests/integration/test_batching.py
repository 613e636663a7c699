"""The worker loop against a real redis-server: batch sizes, linger, reply keys, per-item errors."""

import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest

from funnel.common import tasks, wire
from funnel.common.store import load_spec
from funnel.common.wire import Job
from funnel.worker.main import serve
from funnel.worker.settings import WorkerSettings

MODEL = "text-embedding"


@pytest.fixture(scope="module")
def spec(model_store):
    return load_spec(model_store, MODEL)


@contextmanager
def running_worker(redis_server, model_store, **flags):
    argv = ["--model", MODEL, "--model-store", str(model_store), "--redis-url", redis_server.url,
            "--worker-id", "test-worker", "--linger-mode", flags.pop("linger_mode", "fixed")]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(WorkerSettings.load(argv), stop), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def text_job(spec, text, keys, deadline_s=30.0, **inputs) -> Job:
    job_id = uuid.uuid4().hex
    inputs = inputs or tasks.load(spec).preprocess(text)
    return Job(id=job_id, model=MODEL, inputs=inputs, reply_to=keys.reply(MODEL, job_id),
               deadline=wire.now_ms() + int(deadline_s * 1000))


def push(client, keys, jobs):
    client.lpush(keys.queue(MODEL), *[wire.encode_job(j) for j in jobs])


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
    sizes = Counter(r.batch_size for r in replies)
    assert sizes == {16: 48, 2: 2}
    # Oldest first: the first 16 queued form the first batch.
    assert {r.batch_size for r in replies[:48]} == {16}
    assert redis_client.llen(keys.inflight(MODEL, "test-worker")) == 0
    assert redis_client.llen(keys.queue(MODEL)) == 0


def test_a_single_job_waits_at_most_the_linger(redis_client, redis_server, model_store, spec, keys):
    with running_worker(redis_server, model_store, batch_size=16, linger_ms=300):
        assert_worker_registered(redis_client, keys)
        job = text_job(spec, "alone", keys)
        started = time.monotonic()
        push(redis_client, keys, [job])
        reply = await_reply(redis_client, job)
        elapsed = time.monotonic() - started
    assert reply.ok and reply.batch_size == 1
    assert 0.29 <= elapsed <= 0.3 + 1.0 + reply.infer_ms / 1000


def test_adaptive_linger_does_not_make_a_lone_job_wait(redis_client, redis_server, model_store, spec,
                                                       keys):
    with running_worker(redis_server, model_store, batch_size=16, linger_ms=1000, linger_mode="adaptive"):
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


def assert_worker_registered(client, keys, timeout=30):
    deadline = time.monotonic() + timeout
    while not client.exists(keys.worker(MODEL, "test-worker")):
        assert time.monotonic() < deadline, "worker never registered"
        time.sleep(0.05)


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

"""Load shedding by predicted wait: the estimate, the deadline header, the cached worker view, the push script."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import numpy as np
import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.contracts.wire import JOB_FORMAT, item_count, now_ms
from funnel.common.errors import BadInput, NoWorker, Overloaded, Timeout, Unavailable
from funnel.common.link import lua_scripts
from funnel.web.catalog import Catalog
from funnel.web.pipeline import Inference, Pipeline
from funnel.web.queueing import push_script, shedding
from funnel.web.queueing.shedding import WorkerView, capacity, request_timeout, retry_after_s
from funnel.web.settings import WebSettings
from funnel.worker.stats import Stats

MODEL = "image-classifier"


def worker(worker_id: str, item_s: float | None = 0.01, batch_s: float = 0.02, size: int = 16,
           model: str = MODEL) -> dict[str, str]:
    fields = {"id": worker_id, "model": model, "batch_size": str(size), "wire": str(JOB_FORMAT)}
    if item_s is not None:
        fields.update(item_seconds=repr(item_s), batch_seconds=repr(batch_s))
    return fields


def test_the_deadline_header_is_capped_and_checked():
    assert request_timeout({}, 30) == 30
    assert request_timeout({"X-Request-Timeout": "2.5"}, 30) == 2.5
    assert request_timeout({"X-Request-Timeout": "600"}, 30) == 30
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(BadInput) as caught:
            request_timeout({"X-Request-Timeout": bad}, 30)
        assert caught.value.code == "bad_timeout"


def test_capacity_sums_the_workers_rates():
    one = capacity([worker("a")], MODEL)
    assert one.rate == pytest.approx(16 / (0.01 * 16 + 0.02))
    two = capacity([worker("a"), worker("b"), worker("c", model="other")], MODEL)
    assert two.workers == ("a", "b") and two.rate == pytest.approx(2 * one.rate)
    # A worker that has not timed a batch yet counts as the mean of the others.
    assert capacity([worker("a"), worker("new", item_s=None)], MODEL).rate == pytest.approx(two.rate)
    assert not capacity([worker("new", item_s=None)], MODEL).known
    assert capacity([], MODEL).workers == ()


def test_a_process_serving_several_models_shares_its_rate_among_those_it_holds_loaded():
    alone = capacity([worker("solo")], MODEL).rate
    # One process, "many", serves four models: three loaded, one cold; and a one-model worker beside it.
    states = {MODEL: "resident", "b": "resident", "c": "loading", "d": "cold"}
    members = [{**worker(f"many.{m}.1", model=m), "process": "many", "state": state} for m, state in states.items()]
    view = [*members, worker("solo")]
    assert capacity(view, MODEL).rate == pytest.approx(alone + alone / 3)  # a third of the process, and solo
    assert capacity(view, "d").rate == pytest.approx(alone / 3)  # loading it puts one of the three out
    # Traffic on every model it holds runs at the process's rate in sum, not three times it.
    assert sum(capacity(members, m).rate for m in (MODEL, "b", "c")) == pytest.approx(alone)
    # A process holding one model loaded gives it all its time; one holding none, its cold models too.
    one = [{**m, "state": "cold" if m["model"] != MODEL else "resident"} for m in members]
    assert capacity(one, MODEL).rate == pytest.approx(alone) and capacity(one, "b").rate == pytest.approx(alone)
    idle = [{**m, "state": "cold"} for m in members]
    assert capacity(idle, "b").rate == pytest.approx(alone)
    # A member not timed yet counts as the mean of the model's timed workers, its share as any member's.
    untimed = [{**m, **({"item_seconds": "", "batch_seconds": ""} if m["model"] == MODEL else {})} for m in members]
    assert capacity([*untimed, worker("solo")], MODEL).rate == pytest.approx(alone + alone / 3)


def test_a_chain_on_a_process_of_several_models_takes_none_of_their_time_and_gives_none():
    alone = capacity([worker("solo")], MODEL).rate
    # One process serves a chain and its two steps, all loaded: the chain runs on a thread of its own.
    members = [{**worker(f"many.{m}.1", model=m), "process": "many", "state": "resident",
                **({"backend": "chain"} if m == "chain" else {})} for m in ("chain", MODEL, "b")]
    assert capacity(members, "chain").rate == pytest.approx(alone)
    assert capacity(members, MODEL).rate == pytest.approx(alone / 2)  # the two steps share the process


def test_the_wait_grows_with_the_work_ahead_and_is_never_below_one_batch():
    cap = capacity([worker("a")], MODEL)
    one_batch = (0.01 * 1 + 0.02) * shedding.SAFETY + shedding.OVERHEAD_S
    assert cap.wait_s(0, 1) == pytest.approx(one_batch)
    waits = [cap.wait_s(ahead, 1) for ahead in (0, 16, 160, 1600)]
    assert waits == sorted(waits) and waits[-1] == pytest.approx(1601 / cap.rate * shedding.SAFETY
                                                                  + shedding.OVERHEAD_S)
    assert [retry_after_s(w) for w in (0.2, 1.0, 1.01, 7.5, 1e9)] == [1, 1, 2, 8, shedding.MAX_RETRY_AFTER_S]


def test_the_worker_publishes_its_batch_cost():
    stats = Stats()
    assert not set(registry.COST_FIELDS) & set(stats.fields())  # nothing before a batch
    for size in (1, 4, 16, 16, 8):
        stats.batch(size, 0, 0.005 * size + 0.02, 0.0)
    fields = {**stats.fields(), "batch_size": "16"}
    item_s, batch_s, size = registry.batch_cost(fields)
    assert item_s == pytest.approx(0.005, rel=1e-3) and batch_s == pytest.approx(0.02, rel=1e-3) and size == 16
    assert registry.batch_cost({"batch_size": "16"}) is None


def test_the_worker_view_reads_the_registry_once_per_refresh(monkeypatch):
    reads, now = [], [0.0]

    def live_workers(client, keys):
        reads.append(now[0])
        return [worker("a")] if now[0] >= 5 else []

    monkeypatch.setattr(registry, "live_workers", live_workers)
    monkeypatch.setattr(registry, "epoch", lambda client, keys: "e1")
    view = WorkerView(None, None, refresh_s=1.0, clock=lambda: now[0])
    assert view.capacity(MODEL).workers == () and len(reads) == 1
    view.capacity(MODEL)
    assert len(reads) == 1  # no worker: re-read, but not more than every EMPTY_REFRESH_S
    now[0] = 5.0
    assert view.capacity(MODEL).workers == ("a",) and len(reads) == 2  # a new worker is seen at once
    for t in (5.1, 5.5, 5.9):
        now[0] = t
        view.capacity(MODEL)
    assert len(reads) == 2
    now[0] = 6.0
    view.capacity(MODEL)
    assert len(reads) == 3


def test_a_worker_gone_is_gone_but_after_redis_failed_or_lost_its_data_a_grace_holds(monkeypatch):
    now, epoch, workers, down = [0.0], ["e1"], [[worker("a")]], [False]

    def live_workers(client, keys):
        if down[0]:
            raise redis.ConnectionError("down")
        return workers[0]

    monkeypatch.setattr(registry, "live_workers", live_workers)
    monkeypatch.setattr(registry, "epoch", lambda client, keys: epoch[0])
    view = WorkerView(None, None, refresh_s=1.0, clock=lambda: now[0])
    assert view.capacity(MODEL).workers == ("a",)
    workers[0], now[0] = [], 2.0  # the worker deregistered (or its heartbeat expired): same epoch
    assert view.capacity(MODEL).workers == () and view.grace_s(MODEL) == 0
    workers[0], now[0] = [worker("a")], 3.0
    assert view.capacity(MODEL).workers == ("a",)
    workers[0], epoch[0], now[0] = [], "e2", 5.0  # Redis lost its data: the workers will beat again
    assert view.capacity(MODEL).workers == ()
    assert view.grace_s(MODEL) == pytest.approx(shedding.NO_WORKER_GRACE_S)
    assert view.grace_s(MODEL, version=2) == 0  # never seen served: no grace
    now[0] = 5.0 + shedding.NO_WORKER_GRACE_S
    assert view.grace_s(MODEL) == 0
    # A failover longer than the heartbeat TTL: the hashes expired meanwhile, the epoch is the same.
    workers[0], now[0] = [worker("a")], 20.0
    assert view.capacity(MODEL).workers == ("a",)
    down[0], now[0] = True, 21.0
    with pytest.raises(redis.ConnectionError):
        view.capacity(MODEL)
    down[0], workers[0], now[0] = False, [], 40.0
    assert view.capacity(MODEL).workers == ()
    assert view.grace_s(MODEL) == pytest.approx(shedding.NO_WORKER_GRACE_S)  # counted from its end
    now[0] = 41.0
    assert view.grace_s(MODEL) == pytest.approx(shedding.NO_WORKER_GRACE_S - 1)
    workers[0], now[0] = [worker("a")], 42.0
    assert view.capacity(MODEL).workers == ("a",)
    workers[0], now[0] = [], 43.0  # seen since: gone is gone
    assert view.capacity(MODEL).workers == () and view.grace_s(MODEL) == 0


# -- the gateway against a real Redis ------------------------------------------------------


def publish(client, keys, worker_id, **cost):
    registry.publish(client, keys, worker_id, worker(worker_id, **cost), ttl_s=30)


def pixels(n=1):
    return [{"pixels": np.zeros((2, 2, 3), np.uint8)} for _ in range(n)]


@contextlib.contextmanager
def pipeline(client, keys, **settings):
    """The web tier's pipeline (no models in its catalog: run() takes prepared inputs), its inbox
    closed after."""
    opened = Pipeline(Catalog("/nonexistent", [], {}), client, keys, WebSettings(**settings))
    try:
        yield opened
    finally:
        opened.inbox.close()


def request(items: list, timeout_s: float) -> Inference:
    """Prepared items for MODEL version 1, due in timeout_s."""
    return Inference(model=MODEL, version=1, items=items, deadline=now_ms() + int(timeout_s * 1000))


def submit(pipe: Pipeline, timeout_s: float):
    return asyncio.run(pipe.run(request(pixels(), timeout_s)))


def test_no_live_worker_is_503_at_once_unless_held(redis_client, keys):
    with pipeline(redis_client, keys) as gateway, pytest.raises(Unavailable) as caught:
        submit(gateway, 0.2)
    assert caught.value.code == "no_worker" and caught.value.retry_after == NoWorker.retry_after
    assert redis_client.llen(keys.queue(MODEL)) == 0
    with pipeline(redis_client, keys, hold_without_workers=True) as held, pytest.raises(Exception) as timed_out:
        submit(held, 0.2)
    assert timed_out.value.status == 504 and redis_client.llen(keys.queue(MODEL)) == 1


def test_a_request_held_in_the_grace_is_answered_503_when_no_worker_comes(redis_client, keys, monkeypatch):
    monkeypatch.setattr(shedding, "NO_WORKER_GRACE_S", 0.5)
    publish(redis_client, keys, "w1")
    with pipeline(redis_client, keys) as gateway:
        assert gateway.workers.capacity(MODEL).workers == ("w1",)
        redis_client.flushall()  # Redis lost its data: the registry is empty, and a new epoch comes
        gateway.workers._read_at = -math.inf
        started = time.monotonic()
        with pytest.raises(NoWorker):
            submit(gateway, 30)
        waited = time.monotonic() - started
        assert 0.3 < waited < 2.0  # the grace, not the request's 30 s deadline
        assert redis_client.llen(keys.queue(MODEL)) == 1
        assert redis_client.zcard(keys.gone(MODEL)) == 1  # marked: a worker that comes late drops it unrun


def test_a_wait_past_the_deadline_is_refused_before_it_is_queued(redis_client, keys):
    publish(redis_client, keys, "w1", item_s=0.01, batch_s=0.02)  # about 89 items/s
    with pipeline(redis_client, keys) as gateway:
        cap = gateway.workers.capacity(MODEL)
        redis_client.lpush(keys.queue(MODEL), *[b"x"] * 300)  # about 3.4 s of work
        redis_client.lpush(keys.inflight(MODEL, "w1"), *[b"y"] * 16)
        with pytest.raises(Overloaded) as caught:
            submit(gateway, 2.0)
        expected = cap.wait_s(316, 1)
        assert caught.value.retry_after == retry_after_s(expected) and f"{expected:.1f} s" in caught.value.message
        assert redis_client.llen(keys.queue(MODEL)) == 300  # never queued
        # A longer deadline is let in (and times out here, nobody works).
        with pytest.raises(Exception) as timed_out:
            submit(gateway, expected + 0.3)
        assert timed_out.value.status == 504 and redis_client.llen(keys.queue(MODEL)) == 301
    # Turned off, nothing is refused by estimate.
    with pipeline(redis_client, keys, shed=False) as off, pytest.raises(Exception) as late:
        submit(off, 0.1)
    assert late.value.status == 504


def test_the_lua_estimate_matches_the_python_one(redis_client, keys):
    publish(redis_client, keys, "w1", item_s=0.004, batch_s=0.03)
    cap = shedding.WorkerView(redis_client, keys).capacity(MODEL)
    push = lua_scripts.register(redis_client, "push")
    for ahead in (0, 5, 40, 200):
        redis_client.delete(keys.queue(MODEL))
        if ahead:
            redis_client.lpush(keys.queue(MODEL), *[b"x"] * ahead)
        wait = cap.wait_s(ahead, 2)
        for budget, admitted in ((wait * 0.98, False), (wait * 1.02, True)):
            call = push_script.PushCall(model=MODEL, version=1, lane="normal", jobs=[b"j1", b"j2"],
                                        estimate=cap.script_args(), inflight=["w1"], budget_s=budget, token="t")
            outcome, *_ = push(keys=call.keys(keys), args=call.args())
            assert (outcome == 1) == admitted, (ahead, budget, wait)
            if admitted:
                redis_client.ltrim(keys.queue(MODEL), 2, -1)


def test_a_full_queue_says_when_it_drains(redis_client, keys):
    publish(redis_client, keys, "w1", item_s=0.01, batch_s=0.02)
    redis_client.lpush(keys.queue(MODEL), *[b"x"] * 4)
    with pipeline(redis_client, keys, max_queue=4) as gateway, pytest.raises(Overloaded) as caught:
        submit(gateway, 30)
    assert caught.value.code == "overloaded" and caught.value.retry_after == 1


def test_calibration_follows_late_answers_and_relaxes_back():
    now = [0.0]
    calibration = shedding.Calibration(clock=lambda: now[0])
    assert calibration.factor(MODEL) == 1.0
    calibration.observe(MODEL, predicted_s=0.1, actual_s=1.0)  # short waits are overhead, not queueing
    assert calibration.factor(MODEL) == 1.0
    for _ in range(20):
        calibration.observe(MODEL, predicted_s=1.0, actual_s=2.0)
    assert calibration.factor(MODEL) == pytest.approx(2.0, rel=0.01)
    assert calibration.factor("other") == 1.0  # per model
    calibration.observe(MODEL, predicted_s=1.0, actual_s=100.0)  # one outlier moves it a bounded step
    late = calibration.factor(MODEL)
    assert late < shedding.MAX_CALIBRATION
    now[0] += shedding.CALIBRATE_HALF_LIFE_S
    assert calibration.factor(MODEL) == pytest.approx(1 + (late - 1) / 2)  # no answers: halfway back
    for _ in range(40):
        calibration.observe(MODEL, predicted_s=1.0, actual_s=0.5)  # early answers: back to the registry's figure
    assert calibration.factor(MODEL) == pytest.approx(1.0, abs=0.01)
    cap = capacity([worker("a")], MODEL)
    queueing = cap.wait_s(100, 1) - shedding.OVERHEAD_S
    assert cap.wait_s(100, 1, 2.0) - shedding.OVERHEAD_S == pytest.approx(2 * queueing)


def queued_jobs(client, keys) -> list[int]:
    return [item_count(raw) for raw in client.lrange(keys.queue(MODEL), 0, -1)][::-1]


def test_a_request_is_one_job_or_one_per_batch_of_its_workers(redis_client, keys):
    with pipeline(redis_client, keys, hold_without_workers=True, shed=False) as held, pytest.raises(Timeout):
        asyncio.run(held.run(request(pixels(40), 0.2)))  # no worker: one job, whatever its size
    assert queued_jobs(redis_client, keys) == [40]
    redis_client.delete(keys.queue(MODEL))
    publish(redis_client, keys, "w1", item_s=None)  # a batch of 16, not timed yet
    with pipeline(redis_client, keys, shed=False) as gateway, pytest.raises(Exception) as timed_out:
        asyncio.run(gateway.run(request(pixels(40), 0.2)))
    assert timed_out.value.status == 504 and queued_jobs(redis_client, keys) == [16, 16, 8]


def test_while_a_worker_that_reads_one_item_a_job_serves_every_job_holds_one(redis_client, keys):
    """A worker from before jobs of several items (no `wire` in its hash) would dead-letter one:
    beside it, a request of 40 items is 40 jobs; once it has gone, jobs of a batch again."""
    publish(redis_client, keys, "new", item_s=None)
    older = {k: v for k, v in worker("old", item_s=None).items() if k != "wire"}
    registry.publish(redis_client, keys, "old", older, ttl_s=30)
    with pipeline(redis_client, keys, shed=False) as gateway, pytest.raises(Timeout):
        asyncio.run(gateway.run(request(pixels(40), 0.2)))
    assert queued_jobs(redis_client, keys) == [1] * 40
    redis_client.delete(keys.queue(MODEL), keys.worker(MODEL, "old"))
    with pipeline(redis_client, keys, shed=False) as gateway, pytest.raises(Timeout):
        asyncio.run(gateway.run(request(pixels(40), 0.2)))
    assert queued_jobs(redis_client, keys) == [16, 16, 8]


def test_jobs_ahead_count_as_this_process_s_mean_items_a_job(redis_client, keys):
    publish(redis_client, keys, "w1", item_s=0.01, batch_s=0.02)  # about 89 items/s, batches of 16
    with pipeline(redis_client, keys) as gateway:
        cap = gateway.workers.capacity(MODEL)
        redis_client.lpush(keys.queue(MODEL), *[b"x"] * 20)  # 20 jobs: 20 items, or 320 of 16 each
        with pytest.raises(Exception) as timed_out:
            asyncio.run(gateway.run(request(pixels(16), 1.5)))
        assert timed_out.value.status == 504  # let in: 36 items ahead and its own, about 0.4 s
        for _ in range(100):
            gateway.job_sizes.observe(MODEL, 16, 1)
        assert gateway.job_sizes.of(MODEL) == pytest.approx(16, rel=0.01)
        with pytest.raises(Overloaded) as caught:
            asyncio.run(gateway.run(request(pixels(16), 1.5)))
        ahead = math.ceil(21 * gateway.job_sizes.of(MODEL))  # the 20 and the request let in before
        assert f"{cap.wait_s(ahead, 16, gateway.calibration.factor(MODEL)):.1f} s" in caught.value.message

"""Workers killed with SIGKILL or stopped with SIGTERM mid-batch: no request lost, none answered twice.

The worker is a pipeline (worker/main.py: the next batch is taken and
collated, and the last one answered, while one runs), so the kills are also
timed inside each of its stages, with several batches in flight at once:
FUNNEL_TEST_HOLD (worker/hold.py) holds the first batch at the end of one
stage until the test has signalled.
"""

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import (
    FAST_HEARTBEAT,
    PACE_S,
    PACED,
    PACED_ENV,
    TEXT,
    assert_each_answered_once,
    cached_store,
    freeze_holding_jobs,
    http,
    load_running,
    paced_expected,
    send,
    send_vectors,
    stray_replies,
    texts,
    wait_for,
)


def text_stack(model_store, tmp_path, **web_env) -> Stack:
    return Stack(model_store=model_store, models=[TEXT], workers=[], log_dir=tmp_path,
                 worker_env={**FAST_HEARTBEAT, "FUNNEL_LINGER_MS": "20", "FUNNEL_BATCH_SIZE": "8"},
                 web_env=web_env)


def paced_stack(paced_store, tmp_path, **web_env) -> Stack:
    """The paced toy scorer, no worker yet: requests are held in its queue until one starts, which
    then takes them all in one batch and holds them PACE_S while it runs."""
    return Stack(model_store=paced_store, models=[PACED], workers=[], log_dir=tmp_path,
                 worker_env={**PACED_ENV, **FAST_HEARTBEAT},
                 web_env={**PACED_ENV, "FUNNEL_HOLD_WITHOUT_WORKERS": "1", **web_env})


def queued(client, n: int) -> bool:
    return client.llen(f"funnel:queue:{{{PACED}}}:1") == n


def holding(client, worker_id: str, n: int) -> bool:
    return client.llen(f"funnel:inflight:{{{PACED}}}:{worker_id}") == n


def still_running(proc):
    """A wait_for check: waiting on a worker that has exited is pointless."""
    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
    return check


def worker_info(client, worker_id, model=TEXT):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"funnel:worker:{{{model}}}:{worker_id}").items()}


def test_kill_one_of_two_workers_mid_run(model_store, tmp_path, expected_embeddings, report):
    batch = texts(300, "two-workers")
    expected = expected_embeddings(batch)
    with text_stack(model_store, tmp_path) as stack:
        victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim")
        stack.start_worker(TEXT, FUNNEL_WORKER_ID="survivor")
        stack.wait_ready(60, expected={TEXT: 2})
        client = redis.Redis.from_url(stack.redis_url)
        progress = threading.Semaphore(0)
        with load_running(stack, batch, expected, 16, progress=progress) as outcome:
            for _ in range(60):  # a fifth of the run answered: kill in the middle
                progress.acquire(timeout=60)
            held = freeze_holding_jobs(client, victim, "victim")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        stray = stray_replies(client, stack)
        # The counter reaches the worker's hash on its next heartbeat.
        recovered = wait_for(lambda: int(worker_info(client, "survivor")["recovered"]), what="count")
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert recovered >= held > 0


@pytest.mark.parametrize("run_in", ["graph", "python"])
def test_kill_the_only_worker_then_start_another(run_in, request, tmp_path, report):
    """A graph's worker, or one whose model runs in Python in a process of its own (killed with it)."""
    store = request.getfixturevalue("paced_store" if run_in == "graph" else "paced_python_store")
    batch = toy_model.vectors(40, seed=2)
    with paced_stack(store, tmp_path, FUNNEL_REQUEST_TIMEOUT_S="30") as stack:
        client = redis.Redis.from_url(stack.redis_url)
        with load_running(stack, batch, paced_expected(batch), 40, timeout_s=60, sender=send_vectors) as outcome:
            wait_for(lambda: queued(client, len(batch)), what="all jobs queued")
            victim = stack.start_worker(PACED, FUNNEL_WORKER_ID="only")
            # Its first take holds all 40 for PACE_S: killed in the middle of that batch.
            wait_for(lambda: holding(client, "only", len(batch)), what="all jobs taken",
                     check=still_running(victim))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            assert outcome.sent == 0  # nothing answered before the kill
            stack.start_worker(PACED, FUNNEL_WORKER_ID="replacement")
        stray = stray_replies(client, stack)
        recovered = wait_for(lambda: int(worker_info(client, "replacement", PACED)["recovered"]), what="count")
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert recovered == len(batch)
    assert outcome.slowest_s < 30  # within the request deadline


def test_sigterm_mid_batch_answers_the_batch_and_exits_0(paced_store, tmp_path, report):
    batch = toy_model.vectors(12, seed=3)
    with paced_stack(paced_store, tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        with load_running(stack, batch, paced_expected(batch), 12, timeout_s=30, sender=send_vectors) as outcome:
            wait_for(lambda: queued(client, len(batch)), what="all jobs queued")
            worker = stack.start_worker(PACED, FUNNEL_WORKER_ID="graceful")
            wait_for(lambda: holding(client, "graceful", len(batch)), what="batch taken",
                     check=still_running(worker))
            worker.send_signal(signal.SIGTERM)  # PACE_S into running the batch: it is finished first
            assert outcome.sent == 0  # nothing answered before the signal
            assert worker.wait(timeout=PACE_S + 8) == 0
        stray = stray_replies(client, stack)
        registered = (client.hexists("funnel:workers", "graceful")
                      or client.exists(f"funnel:worker:{{{PACED}}}:graceful"))
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert not registered  # deregistered on the way out


# The pipelined worker's stages, and what its in-flight list holds once its second batch is held at
# the end of each, QUICK_JOBS queued in batches of QUICK_BATCH: the first batch has been answered
# (its reply forgot its own jobs only), and the batches behind the held one fill the pipeline up to
# where it waits (held in take or collate: that batch alone; in run: it, and the next one collated;
# in reply: it, one run and handed over, one run and waiting to be handed over, one collated).
QUICK = "quick-score"
QUICK_BATCH, QUICK_JOBS = 8, 48
IN_FLIGHT_WHEN_HELD = {"take": 8, "collate": 8, "run": 16, "reply": 32}


@pytest.fixture(scope="module")
def quick_store(tmp_path_factory):
    """A store holding QUICK: the toy scorer (no pacing) in batches of QUICK_BATCH."""
    store = tmp_path_factory.mktemp("quick-store")
    done = toy_model.add_toy(store, tmp_path_factory.mktemp("quick"), QUICK, "toyscore.tasks:VectorScore",
                             "--batch-size", str(QUICK_BATCH))
    assert done.returncode == 0, done.stderr
    return store


def send_quick(stack, batch, expected, outcome, clients, progress):
    send(stack, QUICK, batch, lambda vector: {"input": vector},
         lambda vector, body: np.allclose(body["scores"], expected[tuple(vector)], atol=1e-5),
         outcome, clients, progress)


def quick_stack(quick_store, tmp_path) -> Stack:
    """No worker yet: requests are held in QUICK's queue until one starts."""
    return Stack(model_store=quick_store, models=[QUICK], workers=[], log_dir=tmp_path,
                 worker_env={**PACED_ENV, **FAST_HEARTBEAT},
                 web_env={**PACED_ENV, "FUNNEL_HOLD_WITHOUT_WORKERS": "1", "FUNNEL_REQUEST_TIMEOUT_S": "30"})


def in_flight(client, worker_id: str) -> int:
    return client.llen(f"funnel:inflight:{{{QUICK}}}:{worker_id}")


def held_in(stack, client, stage: str, worker_id: str, marker, answered: threading.Semaphore):
    """Start a worker that holds its second batch at the end of `stage`, once all QUICK_JOBS are queued;
    return it once it is there, its first batch is answered, and the batches behind have filled the
    pipeline."""
    wait_for(lambda: client.llen(f"funnel:queue:{{{QUICK}}}:1") == QUICK_JOBS, what="all jobs queued")
    worker = stack.start_worker(QUICK, FUNNEL_WORKER_ID=worker_id, FUNNEL_TEST_HOLD=f"{stage}:2:{marker}")
    wait_for(marker.exists, what=f"the worker held in {stage}", check=still_running(worker))
    for _ in range(QUICK_BATCH):
        assert answered.acquire(timeout=10), "the first batch was not answered"
    wait_for(lambda: in_flight(client, worker_id) == IN_FLIGHT_WHEN_HELD[stage],
             what=f"{IN_FLIGHT_WHEN_HELD[stage]} jobs in flight", check=still_running(worker))
    return worker


@pytest.mark.parametrize("stage", list(IN_FLIGHT_WHEN_HELD))
def test_kill_inside_each_stage_of_the_pipeline(quick_store, tmp_path, report, stage):
    batch = toy_model.vectors(QUICK_JOBS, seed=5)
    with quick_stack(quick_store, tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        answered = threading.Semaphore(0)
        with load_running(stack, batch, paced_expected(batch), QUICK_JOBS, timeout_s=60,
                          sender=send_quick, progress=answered) as outcome:
            victim = held_in(stack, client, stage, "victim", tmp_path / "held", answered)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            assert outcome.sent == QUICK_BATCH  # the first batch alone answered before the kill
            stack.start_worker(QUICK, FUNNEL_WORKER_ID="replacement")
        stray = stray_replies(client, stack)
        recovered = wait_for(lambda: int(worker_info(client, "replacement", QUICK)["recovered"]), what="count")
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert recovered == IN_FLIGHT_WHEN_HELD[stage]


def test_sigterm_with_a_batch_in_every_stage_answers_all_it_took(quick_store, tmp_path, report):
    """Held in reply, the worker holds four batches (one in each place of the pipeline); SIGTERM: it
    answers all four, takes no more, and exits 0; another worker answers the rest."""
    batch = toy_model.vectors(QUICK_JOBS, seed=6)
    held = IN_FLIGHT_WHEN_HELD["reply"]
    with quick_stack(quick_store, tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        answered = threading.Semaphore(0)
        with load_running(stack, batch, paced_expected(batch), QUICK_JOBS, timeout_s=60, sender=send_quick,
                          progress=answered) as outcome:
            worker = held_in(stack, client, "reply", "graceful", tmp_path / "held", answered)
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=15) == 0
            for _ in range(held):  # every job it held is answered...
                assert answered.acquire(timeout=10)
            assert in_flight(client, "graceful") == 0
            left = QUICK_JOBS - QUICK_BATCH - held
            assert client.llen(f"funnel:queue:{{{QUICK}}}:1") == left  # ...and no other taken
            stack.start_worker(QUICK, FUNNEL_WORKER_ID="next")
        stray = stray_replies(client, stack)
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)


WAITERS = 24  # requests waiting on one cached item under way


def test_a_worker_killed_computing_an_item_others_wait_on_answers_every_one(
        model_store, tmp_path, expected_embeddings):
    """A cached model: one request queues a new text, its worker is held at the end of the run and
    WAITERS - 1 more requests (some naming it twice) wait on that job; the worker is SIGKILLed, a
    peer recovers the job, and its one answer reaches every request: all 200, the same vector,
    one miss. The key's concurrency cap counts the requests under way: the kill comes once every
    one has pushed."""
    text = "one text that everybody asks for while its worker dies"
    headers = {"Authorization": "Bearer alpha-key"}
    with Stack(model_store=cached_store(model_store, tmp_path), models=[TEXT], workers=[], log_dir=tmp_path,
               worker_env={**FAST_HEARTBEAT, "FUNNEL_INTRA_OP_THREADS": "1"},
               web_env={"FUNNEL_API_KEYS": "alpha=alpha-key", "FUNNEL_REQUEST_TIMEOUT_S": "60",
                        "FUNNEL_KEY_LIMITS": json.dumps({"alpha": {"concurrency": 4 * WAITERS}})}) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        marker = tmp_path / "held"
        victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim", FUNNEL_TEST_HOLD=f"run:1:{marker}")
        stack.wait_ready(60, expected={TEXT: 1})

        def under_way() -> int:
            return sum(client.zcard(key) for key in client.scan_iter(Keys().pattern("running")))

        def ask(twice: bool):
            body = {"texts": [text, text]} if twice else {"text": text}
            return http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body=body, headers=headers)

        with ThreadPoolExecutor(WAITERS) as pool:
            first = pool.submit(ask, False)
            wait_for(marker.exists, what="the victim held after its run", check=still_running(victim))
            rest = [pool.submit(ask, i % 3 == 0) for i in range(WAITERS - 1)]
            wait_for(lambda: under_way() == WAITERS, what="every request pushed and waiting")
            assert not first.done() and not any(f.done() for f in rest)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            assert list(client.scan_iter(Keys().pattern("cache-pending"))), "the item's marker went with the worker"
            stack.start_worker(TEXT, FUNNEL_WORKER_ID="rescuer")
            answers = [future.result(timeout=90) for future in [first, *rest]]
        assert [status for status, _, _ in answers] == [200] * WAITERS, [a[1] for a in answers if a[0] != 200]
        expected = expected_embeddings([text])[text]
        kinds, vectors = [], []
        for _, body, _ in answers:
            for result, meta in zip(body.get("results", [body]), body["meta"] if "results" in body else [body["meta"]]):
                vectors.append(result["embedding"])
                kinds.append(meta["cache"])
        assert np.allclose(vectors, expected, atol=1e-5)
        assert kinds.count("miss") == 1 and kinds.count("coalesced") == len(kinds) - 1, kinds
        assert wait_for(lambda: int(worker_info(client, "rescuer").get("recovered", 0)), what="recovery") == 1
        assert not list(client.scan_iter(Keys().pattern("cache-pending"))), "the marker outlived its answer"
        status, body, got = ask(False)
        assert status == 200 and got["X-Cache"] == "HIT"

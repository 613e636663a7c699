"""Workers killed with SIGKILL or stopped with SIGTERM mid-batch: no request lost, none answered twice."""

import signal
import threading

import redis

from funnel.scripts.stack import Stack
from tests import toy_model
from tests.faults.conftest import (
    FAST_HEARTBEAT,
    PACE_S,
    PACED,
    PACED_ENV,
    TEXT,
    assert_each_answered_once,
    freeze_holding_jobs,
    load_running,
    paced_expected,
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


def test_kill_the_only_worker_then_start_another(paced_store, tmp_path, report):
    batch = toy_model.vectors(40, seed=2)
    with paced_stack(paced_store, tmp_path, FUNNEL_REQUEST_TIMEOUT_S="30") as stack:
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

"""Workers killed with SIGKILL or stopped with SIGTERM mid-batch: no request lost, none answered twice."""

import signal
import threading

import redis

from funnel.scripts.stack import Stack
from tests.faults.conftest import (
    FAST_HEARTBEAT,
    TEXT,
    assert_each_answered_once,
    freeze_holding_jobs,
    load_running,
    stray_replies,
    texts,
    wait_for,
)


def text_stack(model_store, tmp_path, **web_env) -> Stack:
    return Stack(model_store=model_store, models=[TEXT], workers=[], log_dir=tmp_path,
                 worker_env={**FAST_HEARTBEAT, "FUNNEL_LINGER_MS": "20", "FUNNEL_BATCH_SIZE": "8",
                             "FUNNEL_LINGER_MODE": "fixed"},  # hold jobs for the whole linger
                 web_env=web_env)


def worker_info(client, worker_id):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"funnel:worker:{{{TEXT}}}:{worker_id}").items()}


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


def test_kill_the_only_worker_then_start_another(model_store, tmp_path, expected_embeddings, report):
    batch = texts(40, "only-worker")
    expected = expected_embeddings(batch)
    with text_stack(model_store, tmp_path, FUNNEL_REQUEST_TIMEOUT_S="30") as stack:
        victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="only", FUNNEL_LINGER_MS="5000",
                                    FUNNEL_BATCH_SIZE="64")
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        with load_running(stack, batch, expected, 40, timeout_s=60) as outcome:
            wait_for(lambda: client.llen(f"funnel:inflight:{{{TEXT}}}:only") == len(batch), what="all jobs taken")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            stack.start_worker(TEXT, FUNNEL_WORKER_ID="replacement")
        stray = stray_replies(client, stack)
        recovered = wait_for(lambda: int(worker_info(client, "replacement")["recovered"]), what="count")
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert recovered == len(batch)
    assert outcome.slowest_s < 30  # within the request deadline


def test_sigterm_mid_batch_answers_the_batch_and_exits_0(model_store, tmp_path, expected_embeddings,
                                                         report):
    batch = texts(12, "sigterm")
    expected = expected_embeddings(batch)
    with text_stack(model_store, tmp_path) as stack:
        worker = stack.start_worker(TEXT, FUNNEL_WORKER_ID="graceful", FUNNEL_LINGER_MS="10000",
                                    FUNNEL_BATCH_SIZE="64")
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        with load_running(stack, batch, expected, 12, timeout_s=30) as outcome:
            wait_for(lambda: client.llen(f"funnel:inflight:{{{TEXT}}}:graceful") == len(batch), what="batch taken")
            worker.send_signal(signal.SIGTERM)  # lingering for 10 s: the stop cuts it short
            assert worker.wait(timeout=8) == 0
        stray = stray_replies(client, stack)
        registered = client.hexists("funnel:workers", "graceful") or client.exists(f"funnel:worker:{{{TEXT}}}:graceful")
    report(outcome, stray)
    assert_each_answered_once(outcome, len(batch), stray)
    assert not registered  # deregistered on the way out

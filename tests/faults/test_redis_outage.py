"""Redis stopped under load, or paused: requests fail fast with 503, then succeed again, with no process restarted."""

import os
import signal
import time

from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, TEXT, Outcome, http, load_running, send_texts, texts, wait_for


def test_redis_down_then_back(model_store, tmp_path, expected_embeddings, report):
    before, during, after = texts(60, "before"), texts(40, "during"), texts(60, "after")
    expected = expected_embeddings(before + during + after)
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path, worker_env=FAST_HEARTBEAT) as stack:
        pids = [p.pid for p in [stack.web, *stack.workers]]
        outcome = Outcome()
        send_texts(stack, before, expected, outcome, clients=8)
        assert outcome.ok == len(before)

        # Stop Redis while requests are in flight.
        with load_running(stack, during, expected, 8, outcome=outcome, timeout_s=60):
            stack.redis.stop()
        down = Outcome()
        send_texts(stack, texts(20, "down"), {}, down, clients=4)
        assert down.statuses == {503: 20}, down.statuses
        assert down.slowest_s < 1.5  # fast, no hang
        status, health, _ = http("GET", f"{stack.url}/readyz")
        assert status == 503

        stack.redis.start()  # same port, empty: queues are transient
        wait_for(lambda: http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                              json_body={"text": "are you back?"})[0] == 200, timeout_s=30,
                 interval_s=0.2, what="service back after Redis restart")
        send_texts(stack, after, expected, outcome, clients=8)
        assert [p.pid for p in [stack.web, *stack.workers]] == pids
        assert all(p.poll() is None for p in [stack.web, *stack.workers])
    for extra in (down,):
        for status, n in extra.statuses.items():
            for _ in range(n):
                outcome.add(status, extra.slowest_s)
    report(outcome, 0)
    assert set(outcome.statuses) <= {200, 503}, outcome.statuses  # never a 500 or a hang
    assert outcome.statuses[200] >= len(before) + len(after)
    assert outcome.wrong == 0
    assert outcome.sent == len(before) + len(during) + 20 + len(after)


def test_a_redis_that_stops_answering_costs_a_bounded_wait_then_503(model_store, tmp_path):
    """SIGSTOP: Redis keeps its connections open and answers nothing, as a paused or cut-off host."""
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path) as stack:
        pids = [p.pid for p in [stack.web, *stack.workers]]
        url = f"{stack.url}/v1/models/{TEXT}/predict"
        assert http("POST", url, json_body={"text": "before"})[0] == 200
        os.kill(stack.redis.process.pid, signal.SIGSTOP)
        try:
            answers = []
            for i in range(4):  # both web processes, whatever the kernel hands them
                started = time.monotonic()
                status, body, _ = http("POST", url, json_body={"text": f"paused {i}"}, timeout=30)
                answers.append((status, time.monotonic() - started, body))
            assert http("GET", f"{stack.url}/healthz", timeout=10)[0] == 200
        finally:
            os.kill(stack.redis.process.pid, signal.SIGCONT)
        assert all(status in (503, 504) and seconds < 5 for status, seconds, _ in answers), answers  # HUNG_REDIS_S: 3
        wait_for(lambda: http("POST", url, json_body={"text": "after"})[0] == 200, timeout_s=30,
                 interval_s=0.2, what="service back after Redis resumed")
        assert [p.pid for p in [stack.web, *stack.workers]] == pids

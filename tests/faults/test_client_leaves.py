"""Under fire: a client that leaves before its answer costs no model time, and an API key past its
limits is told 429 with Retry-After, whatever web process it reaches.

The model is the toy scorer paced like an accelerator (PacedScore: 50 ms a batch of one), so
the queue is saturated by a few dozen requests on any machine.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.web.auth import owner_of
from tests.support import http, one_paced_worker, wait_for

PACED = "toy-paced"
BODY = json.dumps({"input": [0.5, -1, 2, 0]}).encode()
LEAVERS = 120


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    limits = {"slow": {"rate": 2, "burst": 2}, "narrow": {"concurrency": 2}}
    with one_paced_worker(tmp_path_factory, PACED, {"FUNNEL_API_KEYS": "open=key-open,slow=key-slow,narrow=key-narrow",
                                                    "FUNNEL_KEY_LIMITS": json.dumps(limits)}) as running:
        yield running


def predict(stack, key: str = "key-open", timeout: float = 60) -> tuple[int, dict, dict]:
    return http("POST", f"{stack.url}/v1/models/{PACED}/predict", BODY, timeout=timeout,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})


def leave_after(stack, seconds: float) -> None:
    """Send a predict, then hang up before its answer."""
    port = int(stack.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /v1/models/%s/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer key-open\r\nContent-Length: %d\r\n\r\n%s"
                     % (PACED.encode(), len(BODY), BODY))
        time.sleep(seconds)


def worker_totals(stack) -> dict[str, float]:
    client = redis.Redis.from_url(stack.redis_url)
    (worker,) = [w for w in registry.live_workers(client, Keys()) if w.get("model") == PACED]
    return {name: registry.counter(worker, name) for name in ("items", "left")}


def test_jobs_of_clients_that_left_are_dropped_unrun(stack):
    predict(stack)  # the worker is up and has run one
    before = worker_totals(stack)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: leave_after(stack, 0.05), range(LEAVERS)))
    started = time.monotonic()
    status, answer, _ = predict(stack)  # behind the marked jobs, not behind their runs
    waited_s = time.monotonic() - started
    assert status == 200, answer
    client = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: client.llen(Keys().queue(PACED)) == 0, what="the queue drained")
    wait_for(lambda: worker_totals(stack)["items"] + worker_totals(stack)["left"] >= before["items"] + LEAVERS + 1,
             what="every job taken, run or dropped")
    after = worker_totals(stack)
    ran = after["items"] - before["items"] - 1
    assert after["left"] - before["left"] >= LEAVERS * 0.9, (before, after)
    assert ran <= LEAVERS * 0.1, (before, after)  # only those taken before their client left
    # Run one by one, the leavers would take LEAVERS x 50 ms before the last request's turn.
    assert waited_s < LEAVERS * 0.05 / 2, waited_s
    # A dropped job's mark is forgotten; one whose job ran first lasts until the job's deadline.
    gone = Keys().gone(PACED)
    assert client.zcard(gone) <= ran and (client.zcard(gone) == 0 or 0 < client.pttl(gone) <= 30_000)


def test_a_key_past_its_rate_is_told_when_to_come_back(stack):
    statuses = [predict(stack, "key-slow")[0] for _ in range(4)]
    assert statuses[:2] == [200, 200] and 429 in statuses[2:], statuses  # a burst of 2, then 2 a second
    status, answer, headers = predict(stack, "key-slow")
    if status == 429:
        assert answer["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1
        time.sleep(int(headers["Retry-After"]))
    assert predict(stack, "key-slow")[0] == 200  # after the wait it says
    assert predict(stack, "key-open")[0] == 200  # another key is not held back


def test_a_key_at_its_cap_waits_for_its_own_requests(stack):
    outcomes: list[int] = []
    lock = threading.Lock()

    def one(_):
        status = predict(stack, "key-narrow")[0]
        with lock:
            outcomes.append(status)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    assert outcomes.count(200) >= 2 and outcomes.count(429) >= 1, outcomes
    assert set(outcomes) <= {200, 429}
    client = redis.Redis.from_url(stack.redis_url)
    running = Keys().running(PACED, owner_of("key-narrow"))
    wait_for(lambda: client.zcard(running) == 0, what="its requests released")  # each token, once answered
    assert predict(stack, "key-narrow")[0] == 200

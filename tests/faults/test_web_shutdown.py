"""SIGTERM to the web tier: the requests it holds are still answered, then it exits; a dead web tier
behind nginx is a 503 with Retry-After; nginx restarted under load refuses and resets no connection
(README, failure contract).

With FUNNEL_HOLD_WITHOUT_WORKERS and no worker yet, eight requests wait in the
web tier with their jobs queued; the web tier gets SIGTERM, and only then a
worker starts and answers them.
"""

from __future__ import annotations

import collections
import json
import signal
import threading
from http.client import HTTPConnection, HTTPException

import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.front_door import FrontDoor, nginx_binary
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import http, wait_for

TEXT = "text-embedding"
IN_FLIGHT = 8


def test_sigterm_answers_the_requests_in_flight(model_store, tmp_path):
    env = {"FUNNEL_HOLD_WITHOUT_WORKERS": "1"}
    with Stack(model_store=model_store, models=[TEXT], workers=[], web_env=env, log_dir=tmp_path) as stack:
        queue = redis.Redis.from_url(stack.redis_url)
        answers: dict[int, tuple] = {}

        def ask(i: int) -> None:
            answers[i] = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": f"held {i}"},
                              timeout=60)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        wait_for(lambda: queue.llen(Keys().queue(TEXT)) == IN_FLIGHT, what="the requests' jobs queued")
        stack.web.send_signal(signal.SIGTERM)
        stack.start_worker(TEXT)
        for thread in threads:
            thread.join(60)
        assert sorted(answers) == list(range(IN_FLIGHT))
        assert all(status == 200 and len(body["embedding"]) == 384 for status, body, _ in answers.values()), answers
        assert stack.web.wait(timeout=30) == 0


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")
def test_a_dead_web_tier_behind_nginx_is_503_with_retry_after():
    door = FrontDoor(free_port(), free_port()).start()  # nothing listens on the upstream's port
    try:
        status, body, headers = http("POST", f"http://127.0.0.1:{door.port}/v1/models/{TEXT}/predict",
                                     json_body={"text": "anyone there?"})
    finally:
        door.stop()
    assert status == 503, (status, body)
    assert body["error"]["code"] == "unavailable" and int(headers["Retry-After"]) >= 1


RESTARTS = 10


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")
def test_nginx_restarted_under_load_answers_every_request(model_store, tmp_path):
    """Clients on a connection each (as the chaos soak's) while nginx is replaced again and again:
    the new nginx takes the old one's socket, so every request gets its answer, none a reset."""
    with Stack(model_store=model_store, models=[TEXT], front_door=True, log_dir=tmp_path) as stack:
        outcomes: collections.Counter = collections.Counter()
        done = threading.Event()

        def client(n: int) -> None:
            while not done.is_set():
                conn = HTTPConnection("127.0.0.1", stack.port, timeout=30)
                try:
                    conn.request("POST", f"/v1/models/{TEXT}/predict", body=json.dumps({"text": f"client {n}"}),
                                 headers={"Content-Type": "application/json", "Connection": "close"})
                    response = conn.getresponse()
                    outcome = str(response.status) if len(json.loads(response.read()).get("embedding", ())) \
                        == 384 else f"{response.status} without an embedding"
                except (ConnectionError, HTTPException, OSError) as exc:
                    outcome = type(exc).__name__
                finally:
                    conn.close()
                outcomes[outcome] += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        try:
            for restart in range(1, RESTARTS + 1):
                wait_for(lambda n=restart: outcomes.total() >= 20 * n, what="twenty answers between restarts")
                stack.front_door.restart()
        finally:
            done.set()
            for thread in threads:
                thread.join(60)
    assert set(outcomes) == {"200"}, outcomes

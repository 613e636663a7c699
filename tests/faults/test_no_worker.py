"""The last worker gone: every request after it is answered 503 `no_worker` at once, never held to its
deadline for a worker that will not come (README, failure contract).

A worker that deregistered (SIGTERM) or whose heartbeat expired (kill -9) is gone; only after Redis
lost its data does a web process hold a request for the workers to register again, for
NO_WORKER_GRACE_S at most (tests/unit/test_shedding.py).
"""

from __future__ import annotations

import signal
import time

import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, TEXT, http, wait_for

ASKS = 8  # requests after the worker has gone, spread over the grace the web tier keeps for a restart
SPREAD_S = 5.0  # within NO_WORKER_GRACE_S of the last answer


def ask(stack: Stack) -> tuple[int, str, float]:
    started = time.monotonic()
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "still there?"},
                           headers={"X-Request-Timeout": "10"}, timeout=30)
    return status, body.get("error", {}).get("code", ""), time.monotonic() - started


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_the_last_worker_gone_is_503_at_once(how, model_store, tmp_path):
    with Stack(model_store=model_store, models=[TEXT], worker_env=FAST_HEARTBEAT, log_dir=tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        assert ask(stack)[0] == 200  # the web tier has seen the model served
        (worker,) = stack.workers
        worker.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        worker.wait(timeout=30)
        # Deregistered at once, or its heartbeat's TTL (2 s) runs out.
        wait_for(lambda: not registry.live_workers(client, Keys()), timeout_s=10, what="the worker's hash gone")
        answers = []
        first = time.monotonic()
        for i in range(ASKS):
            answers.append(ask(stack))
            time.sleep(max(0.0, first + SPREAD_S * (i + 1) / ASKS - time.monotonic()))  # spread, not waited on
        assert all(status == 503 and code == "no_worker" for status, code, _ in answers), answers
        assert max(seconds for _, _, seconds in answers) < 1.0, answers
        assert client.llen(Keys().queue(TEXT)) == 0  # never queued

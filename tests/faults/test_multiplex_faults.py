"""Faults of a worker serving several models (worker/residency.py, worker/multiplex.py):

- killed (kill -9) while it loads one model and runs a batch of another: a peer loads the first once
  the dead loader's claim lapses, recovers the batch, and every request is answered once, correctly;
- a model that fails to load (its file gone): its requests answered 503 `model_unavailable` naming
  why within a second, the load not retried in a loop, the other models served;
- a load that hangs: given up at FUNNEL_LOAD_TIMEOUT_S, its requests answered 503 as above, its claim
  released, the other models served.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import FAST_HEARTBEAT, PACED_ENV, Outcome, assert_each_answered_once, http, stray_replies, wait_for

SLOW, PACED, FINE, BROKEN, HUNG = "slow-load", "paced-copy", "fine-copy", "broken-copy", "hung-load"
LOAD_S = 3.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A model slow to load, one slow to run, one fine, one whose graph file is gone, and one whose load
    hangs (an hour)."""
    store = tmp_path_factory.mktemp("multiplex-store")
    work = tmp_path_factory.mktemp("multiplex-work")
    for name, task, extra, seed in [
        (SLOW, "toyscore.tasks:SlowLoadScore", ["--set", f"load_s={LOAD_S}"], 1),
        (PACED, "toyscore.tasks:PacedScore", ["--set", "pace_batch_s=1.5", "--set", "pace_item_s=0.0",
                                              "--batch-size", "64"], 2),
        (FINE, "toyscore.tasks:VectorScore", [], 3),
        (BROKEN, "toyscore.tasks:VectorScore", [], 4),
        (HUNG, "toyscore.tasks:SlowLoadScore", ["--set", "load_s=3600"], 5),
    ]:
        done = toy_model.add_toy(store, work, name, task, *extra, seed=seed)
        assert done.returncode == 0, done.stderr
    (graph,) = (store / BROKEN).rglob("*.onnx")
    graph.unlink()
    return store


def ask(stack: Stack, model: str, vector: list[float], timeout_s: float = 30) -> tuple[int, dict, float]:
    started = time.monotonic()
    status, body, _ = http("POST", f"{stack.url}/v1/models/{model}/predict", json_body={"input": vector},
                           headers={"X-Request-Timeout": str(timeout_s)}, timeout=timeout_s + 10)
    return status, body, time.monotonic() - started


def seed_of(model: str) -> int:
    return {SLOW: 1, PACED: 2, FINE: 3, BROKEN: 4}[model]


def test_kill_9_while_loading_and_mid_batch_loses_nothing(store, tmp_path, report):
    models = [SLOW, PACED]
    env = {**PACED_ENV, **FAST_HEARTBEAT, "FUNNEL_MAX_RESIDENT": "2"}
    vectors = toy_model.vectors(24, seed=5)
    with Stack(model_store=store, models=models, workers=[], worker_env=env,
               web_env={**PACED_ENV, "FUNNEL_SHED": "0"}, log_dir=tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        keys = Keys()
        doomed = stack.start_worker(",".join(models), FUNNEL_WORKER_ID="doomed")
        stack.wait_ready(60, expected=dict.fromkeys(models, 1))
        outcome = Outcome()

        def one(i: int) -> None:
            model = models[i % 2]
            status, body, seconds = ask(stack, model, vectors[i])
            right = toy_model.expected_scores(np.array([vectors[i]], np.float32), seed=seed_of(model))[0]
            outcome.add(status, seconds, status != 200 or bool(np.allclose(body["scores"], right, atol=1e-5)))

        one(len(vectors) - 1)  # the paced model loaded first: its batches run while the slow one loads
        member = registry.member_id("doomed", SLOW, 1)
        paced = keys.inflight(PACED, registry.member_id("doomed", PACED, 1))
        with ThreadPoolExecutor(len(vectors)) as pool:
            futures = [pool.submit(one, i) for i in range(len(vectors) - 1)]
            wait_for(lambda: client.hget(keys.worker(SLOW, member), "state") == b"loading"
                     and client.llen(paced) > 0, timeout_s=20, what="a load and a batch under way")
            os.kill(doomed.pid, signal.SIGKILL)
            doomed.wait(timeout=10)
            stack.start_worker(",".join(models), FUNNEL_WORKER_ID="peer")
            for future in futures:
                future.result()
        stray = stray_replies(client, stack)
        report(outcome, stray)
        assert_each_answered_once(outcome, len(vectors), stray)
        assert client.llen(keys.dead(SLOW)) == client.llen(keys.dead(PACED)) == 0
        logs = [(tmp_path / f"worker-{SLOW}-and-1-more-{i}.log").read_text() for i in (0, 1)]  # named by the first
        assert [f"loaded {SLOW} version" in log for log in logs] == [False, True]  # killed mid-load; the peer


def test_a_model_that_fails_to_load_is_503_at_once_and_the_others_are_served(store, tmp_path):
    models = [FINE, BROKEN]
    with Stack(model_store=store, models=models, workers=[], worker_env={**PACED_ENV, "FUNNEL_MAX_RESIDENT": "2"},
               web_env=PACED_ENV, log_dir=tmp_path) as stack:
        stack.start_worker(",".join(models), FUNNEL_WORKER_ID="many")
        stack.wait_ready(60, expected=dict.fromkeys(models, 1))
        vector = toy_model.vectors(1, seed=9)[0]
        answers = [ask(stack, BROKEN, vector, timeout_s=20) for _ in range(3)]  # the first makes it load
        for status, body, seconds in answers:
            assert status == 503 and body["error"]["code"] == "model_unavailable", body
            assert "could not be loaded" in body["error"]["message"] and "onnx" in body["error"]["message"]
            assert seconds < 1.0, answers
        status, body, _ = ask(stack, FINE, vector)
        assert status == 200
        assert np.allclose(body["scores"], toy_model.expected_scores(np.array([vector], np.float32), seed=3)[0],
                           atol=1e-5)
        for _ in range(10):  # its requests keep being refused, never a load tried again meanwhile
            assert ask(stack, BROKEN, vector)[0] == 503
        log = next(tmp_path.glob("worker-*.log")).read_text()
        assert log.count(f"could not load {BROKEN}") == 1, log


def test_a_load_that_hangs_is_given_up_and_its_claim_released(store, tmp_path):
    models = [FINE, HUNG]
    env = {**PACED_ENV, "FUNNEL_MAX_RESIDENT": "2", "FUNNEL_LOAD_TIMEOUT_S": "1"}
    with Stack(model_store=store, models=models, workers=[], worker_env=env, web_env=PACED_ENV,
               log_dir=tmp_path) as stack:
        stack.start_worker(",".join(models), FUNNEL_WORKER_ID="many")
        stack.wait_ready(60, expected=dict.fromkeys(models, 1))
        client, keys = redis.Redis.from_url(stack.redis_url), Keys()
        vector = toy_model.vectors(1, seed=9)[0]
        status, body, seconds = ask(stack, HUNG, vector, timeout_s=20)  # makes it load; the load hangs
        assert status == 503 and body["error"]["code"] == "model_unavailable", body
        assert "TimeoutError" in body["error"]["message"] and "FUNNEL_LOAD_TIMEOUT_S" in body["error"]["message"]
        assert 1.0 <= seconds < 3.0, seconds  # the timeout, then a turn of the taker
        assert not client.exists(keys.loading(HUNG))  # released: a peer may load it
        member = registry.member_id("many", HUNG, 1)
        assert client.hget(keys.worker(HUNG, member), "state") == b"failed"
        status, body, _ = ask(stack, FINE, vector)  # loaded beside the hung thread, and served
        assert status == 200
        assert np.allclose(body["scores"], toy_model.expected_scores(np.array([vector], np.float32), seed=3)[0],
                           atol=1e-5)
        status, _, seconds = ask(stack, HUNG, vector)
        assert status == 503 and seconds < 1.0  # refused at once now, not loaded again

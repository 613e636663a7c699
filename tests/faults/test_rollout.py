"""A new version rolled out under continuous load, and rolled back, with nothing lost (README, failure
contract; docs/models.md, "Versions and rollouts").

The store holds the text model as versions 1 and 2. Clients send predicts
without a version all along. With version 1 serving and the traffic pinned to
it, version 2's worker starts; the traffic moves to 90/10, then wholly to
version 2; version 1's queue drains and its worker gets SIGTERM. Then back
the same way: version 1 starts again, takes all the traffic, version 2's
worker stops. Every answer must be a 200 with the right embedding, each
version's share within 3 points of its weight over at least 2,000 requests
while the weights are 90/10, and the answers after each move all from the
version the policy names.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from funnel.web.queueing.shedding import REFRESH_S
from tests.support import TEXT, http, wait_for

CLIENTS = 8
SHARE_SAMPLE = 2000  # answers counted while the weights are 90/10
SETTLE_S = REFRESH_S + 0.5  # a web process reads a new policy within REFRESH_S: answers to requests
# sent before this much time after a move may still follow the old one


@dataclass
class Ledger:
    """Every answer: when its request was sent, its status, its version, whether it was right."""

    rows: list[tuple[float, int, int, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, row: tuple[float, int, int, bool]) -> None:
        with self.lock:
            self.rows.append(row)

    def since(self, moment: float) -> list[tuple[float, int, int, bool]]:
        with self.lock:
            return [row for row in self.rows if row[0] >= moment]


@pytest.fixture
def versioned_store(model_store, tmp_path):
    """The text model as versions 1 and 2 (the same files: which version answered is in the meta)."""
    store = tmp_path / "store"
    (store / TEXT).mkdir(parents=True)
    for version in (1, 2):
        (store / TEXT / str(version)).symlink_to(model_store / TEXT, target_is_directory=True)
    return store


def set_traffic(stack: Stack, weights: dict[int, int]) -> float:
    status, body, _ = http("PUT", f"{stack.url}/v1/models/{TEXT}/traffic",
                           json_body={"weights": {str(v): w for v, w in weights.items()}})
    assert status == 200, body
    return time.monotonic()


def start(stack: Stack, version: int):
    started = time.monotonic()
    worker = stack.start_worker(f"{TEXT}:{version}")
    # A pinned request answers once the new version serves: the time from its start to its first answer.
    wait_for(lambda: http("POST", f"{stack.url}/v1/models/{TEXT}/versions/{version}/predict",
                          json_body={"text": "are you up?"})[0] == 200, timeout_s=120, interval_s=0.2,
             what=f"version {version} answering", check=lambda: worker.poll() is None or _exited(worker))
    return worker, time.monotonic() - started


def _exited(worker) -> None:
    raise RuntimeError(f"the worker exited with {worker.returncode}")


def drain_and_stop(stack: Stack, worker, version: int, client: redis.Redis) -> None:
    """Stop a version's worker once its queue is empty: jobs in it would have nobody to answer them."""
    wait_for(lambda: client.llen(Keys().queue(TEXT, version)) == 0, what=f"version {version}'s queue drained")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


def test_a_rollout_and_a_rollback_under_load_lose_nothing(versioned_store, tmp_path, expected_embeddings):
    sentences = [f"rollout sentence {i} about {'cats ' * (i % 4)}and dogs" for i in range(40)]
    embeddings = expected_embeddings(sentences)
    expected = [embeddings[s] for s in sentences]
    ledger, stop = Ledger(), threading.Event()
    with Stack(model_store=versioned_store, models=[TEXT], workers=[], log_dir=tmp_path) as stack:
        client = redis.Redis.from_url(stack.redis_url)
        v1, _ = start(stack, 1)
        set_traffic(stack, {1: 100})

        def send(offset: int) -> None:
            for i in itertools.count(offset, CLIENTS):
                if stop.is_set():
                    return
                k = i % len(sentences)
                sent = time.monotonic()
                status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                                       json_body={"text": sentences[k]}, timeout=60)
                right = status == 200 and np.allclose(body["embedding"], expected[k], atol=1e-4)
                ledger.add((sent, status, body.get("meta", {}).get("model_version", 0) if status == 200 else 0,
                            right))

        clients = [threading.Thread(target=send, args=(n,)) for n in range(CLIENTS)]
        for thread in clients:
            thread.start()
        try:
            v2, v2_first_answer_s = start(stack, 2)
            canary = set_traffic(stack, {1: 90, 2: 10}) + SETTLE_S
            wait_for(lambda: len(ledger.since(canary)) >= SHARE_SAMPLE, timeout_s=120, what="the canary's sample")
            to_v2 = set_traffic(stack, {2: 100}) + SETTLE_S
            wait_for(lambda: len(ledger.since(to_v2)) >= 200, what="answers after the move to version 2")
            drain_and_stop(stack, v1, 1, client)
            after_v1_stopped = time.monotonic()
            wait_for(lambda: len(ledger.since(after_v1_stopped)) >= 200, what="answers with version 1 gone")
            v1, _ = start(stack, 1)
            back = set_traffic(stack, {1: 100}) + SETTLE_S
            wait_for(lambda: len(ledger.since(back)) >= 200, what="answers after the move back to version 1")
            drain_and_stop(stack, v2, 2, client)
            after_v2_stopped = time.monotonic()
            wait_for(lambda: len(ledger.since(after_v2_stopped)) >= 200, what="answers with version 2 gone")
        finally:
            stop.set()
            for thread in clients:
                thread.join(60)
        canary_rows = [row for row in ledger.since(canary) if row[0] < to_v2 - SETTLE_S]
    statuses = Counter(row[1] for row in ledger.rows)
    assert statuses == {200: len(ledger.rows)}, statuses
    assert all(row[3] for row in ledger.rows), "an answer with another request's embedding"
    shares = Counter(row[2] for row in canary_rows)
    assert len(canary_rows) >= SHARE_SAMPLE
    assert abs(shares[2] / len(canary_rows) - 0.10) <= 0.03, shares
    assert {row[2] for row in ledger.since(to_v2) if row[0] < back - SETTLE_S} == {2}
    assert {row[2] for row in ledger.since(back)} == {1}
    print(f"\nrollout: {len(ledger.rows)} answers, all 200; canary {shares[1]}/{shares[2]} of {len(canary_rows)} "
          f"({shares[2] / len(canary_rows):.3f} to version 2); version 2's worker answered "
          f"{v2_first_answer_s:.1f} s after it started")

"""Under fire: priority lanes. A high request jumps a saturated queue, a low one is still served
under a flood above it (its floor share) and is the first turned away from a full queue; a key
held below high is served in its own highest lane and told so; /v2 and gRPC take Triton's
`priority` parameter through the real tritonclient.

The model is the toy scorer paced like an accelerator (PacedScore: 50 ms a batch of one), so a
few dozen requests saturate it on any machine.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from tests import toy_model
from tests.support import http, metric, one_paced_worker, wait_for

PACED = "toy-paced"
BODY = json.dumps({"input": [0.5, -1, 2, 0]}).encode()
MAX_QUEUE = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with one_paced_worker(tmp_path_factory, PACED, {"FUNNEL_MAX_QUEUE": str(MAX_QUEUE),
                                                    "FUNNEL_API_KEYS": "open=key-open,basic=key-basic",
                                                    "FUNNEL_KEY_LIMITS": json.dumps({"basic": {"priority": "normal"}})},
                          grpc_port=free_port()) as running:
        yield running


def predict(stack, lane: str | None = None, key: str = "key-open") -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    if lane is not None:
        headers["X-Priority"] = lane
    return http("POST", f"{stack.url}/v1/models/{PACED}/predict", BODY, timeout=60, headers=headers)


def queued(stack, lane: str = "normal") -> int:
    return redis.Redis.from_url(stack.redis_url).llen(Keys().queue(PACED, 1, lane))


class Flood:
    """Clients sending normal requests back to back until stopped (or 20 s): each answer's time kept."""

    def __init__(self, stack, clients: int):
        self.stack, self.clients = stack, clients
        self.stop = threading.Event()
        self.answered: list[tuple[float, int]] = []  # (monotonic time, status)
        self.pool = ThreadPoolExecutor(clients)

    def _client(self) -> None:
        ends = time.monotonic() + 20
        while not self.stop.is_set() and time.monotonic() < ends:
            status = predict(self.stack)[0]
            self.answered.append((time.monotonic(), status))

    def __enter__(self) -> Flood:
        for _ in range(self.clients):
            self.pool.submit(self._client)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)


def test_a_high_request_jumps_a_saturated_queue(stack):
    assert predict(stack)[0] == 200  # the worker is up
    with ThreadPoolExecutor(10) as pool:
        normals = [pool.submit(lambda: (predict(stack)[0], time.monotonic())) for _ in range(10)]
        wait_for(lambda: queued(stack) >= 6, what="normal requests queued")
        status, answer, headers = predict(stack, "high")
        high_at = time.monotonic()
        later = sum(f.result()[1] > high_at for f in normals)
    assert status == 200 and headers["X-Priority"] == "high" and answer["meta"]["priority"] == "high"
    assert all(f.result()[0] == 200 for f in normals)
    assert later >= 4, later  # answered ahead of most of the normal requests queued before it


def test_a_low_request_is_served_under_a_flood_above_it(stack):
    with Flood(stack, clients=8) as flood:
        wait_for(lambda: queued(stack) >= 4, what="the flood queued")
        status, answer, headers = predict(stack, "low")
        low_at = time.monotonic()
        wait_for(lambda: sum(t > low_at for t, _ in flood.answered) >= 3, what="the flood going on")
    assert status == 200 and headers["X-Priority"] == "low"  # its floor share, not the flood's end


def test_a_full_queue_turns_low_away_first(stack):
    """The worker paused (SIGSTOP) while the low request is pushed: no take between the queue seen at
    its limit and the push may make room for it."""
    (worker,) = stack.workers
    with Flood(stack, clients=MAX_QUEUE + 6):
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: queued(stack) >= MAX_QUEUE, what="the queue at its limit")
            low = predict(stack, "low")
        finally:
            worker.send_signal(signal.SIGCONT)
        high = predict(stack, "high")
    assert low[0] == 503 and low[1]["error"]["code"] == "overloaded", low[:2]
    assert high[0] == 200, high[:2]


def test_a_key_held_below_high_is_served_in_its_own_lane_and_told(stack):
    status, answer, headers = predict(stack, "high", key="key-basic")
    assert status == 200 and headers["X-Priority"] == "normal" and answer["meta"]["priority"] == "normal"
    status, answer, headers = predict(stack, "low", key="key-basic")  # lower than its highest: as asked
    assert status == 200 and headers["X-Priority"] == "low"


def test_metrics_count_each_keys_requests_by_lane_never_naming_the_key(stack):
    for lane in ("high", "high", "low"):
        assert predict(stack, lane, key="key-basic")[0] == 200
    assert predict(stack, key="key-open")[0] == 200
    text = http_text(f"{stack.url}/metrics", {"Authorization": "Bearer key-open"})
    counted = {lane: metric(text, "funnel_key_requests_total", model=PACED, key="basic", priority=lane, status="200")
               for lane in ("normal", "low")}
    assert counted["normal"] >= 2 and counted["low"] >= 1, counted  # its high requests, served as normal
    assert metric(text, "funnel_key_requests_total", model=PACED, key="open", priority="normal", status="200") >= 1
    assert "key-basic" not in text


def test_a_lane_that_is_no_lane_is_a_400_counted_under_its_key_in_normal(stack):
    """Refused before the pipeline, yet counted per key: in the normal lane, never the client's text."""
    status, answer, _ = predict(stack, "urgent", key="key-basic")
    assert status == 400 and answer["error"]["code"] == "bad_priority", answer
    text = http_text(f"{stack.url}/metrics", {"Authorization": "Bearer key-open"})
    assert metric(text, "funnel_key_requests_total", model=PACED, key="basic", priority="normal", status="400") == 1
    assert "urgent" not in text


def test_v2_and_grpc_take_tritons_priority_parameter(stack):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    stack.wait_grpc()
    rows = np.array([json.dumps([0.5, -1, 2, 0]).encode()], dtype=object)
    auth = {"Authorization": "Bearer key-open"}
    for module, url in ((httpclient, stack.url.split("//", 1)[1]), (grpcclient, f"127.0.0.1:{stack.grpc_port}")):
        client = module.InferenceServerClient(url)
        given = module.InferInput("JSON", [1], "BYTES")
        given.set_data_from_numpy(rows)
        with Flood(stack, clients=MAX_QUEUE + 4):
            wait_for(lambda: queued(stack) >= MAX_QUEUE - 2, what="the flood queued")
            started = time.monotonic()
            result = client.infer(PACED, [given], priority=1, headers={"authorization": "Bearer key-open"})
            waited = time.monotonic() - started
        scores = result.as_numpy("scores")
        np.testing.assert_allclose(scores[0], toy_model.expected_scores(np.array([[0.5, -1, 2, 0]]))[0], atol=1e-5)
        assert waited < 0.05 * (MAX_QUEUE - 2) * 0.7, waited  # not behind the queue: a few batches at most
    status, answer, _ = http("POST", f"{stack.url}/v2/models/{PACED}/infer", json.dumps(
        {"inputs": [{"name": "JSON", "datatype": "BYTES", "shape": [1], "data": ["[0.5, -1, 2, 0]"]}],
         "parameters": {"priority": "urgent"}}).encode(), headers={"Content-Type": "application/json", **auth})
    assert status == 400 and "priority" in answer["error"], answer


def http_text(url: str, headers: dict) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
        return answer.read().decode()

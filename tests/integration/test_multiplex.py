"""One worker serving several models (worker/multiplex.py, worker/residency.py): each request answered by
its own model, models loaded when work waits for them and the least recently used evicted, and the
web tier's views (GET /v1/models, /metrics) telling which worker holds which."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import FAST_HEARTBEAT, PACED_ENV, http, metric, wait_for

MODELS = [f"copy-{i}" for i in range(4)]


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """A store of four copies of the toy scorer, each with weights of its own."""
    store = tmp_path_factory.mktemp("copies")
    for i, name in enumerate(MODELS):
        done = toy_model.add_toy(store, tmp_path_factory.mktemp(name), name, seed=i)
        assert done.returncode == 0, done.stderr
    return store


def ask(stack: Stack, model: str, vectors: list[list[float]]) -> tuple[int, dict]:
    status, body, _ = http("POST", f"{stack.url}/v1/models/{model}/predict", json_body={"inputs": vectors},
                           headers={"X-Request-Timeout": "20"}, timeout=30)
    return status, body


def test_one_worker_answers_each_model_with_its_own_weights(copies, tmp_path):
    vectors = toy_model.vectors(6, seed=3)
    expected = {name: toy_model.expected_scores(np.array(vectors, np.float32), seed=i)
                for i, name in enumerate(MODELS)}
    assert not np.allclose(expected[MODELS[0]], expected[MODELS[1]])  # the copies' answers differ
    with Stack(model_store=copies, models=MODELS, workers=[], worker_env=PACED_ENV, web_env=PACED_ENV,
               log_dir=tmp_path) as stack:
        stack.start_worker(",".join(MODELS), FUNNEL_MAX_RESIDENT="2", FUNNEL_WORKER_ID="many", **FAST_HEARTBEAT)
        stack.wait_ready(60, expected=dict.fromkeys(MODELS, 1))  # each registered, none loaded yet
        listing = http("GET", f"{stack.url}/v1/models")[1]
        states = {m["name"]: [w["state"] for w in m["workers"]] for m in listing["models"]}
        assert states == {name: ["cold"] for name in MODELS}

        def one(round_and_model: tuple[int, str]) -> bool:
            status, body = ask(stack, round_and_model[1], vectors)
            assert status == 200, body
            got = np.array([r["scores"] for r in body["results"]])
            return bool(np.allclose(got, expected[round_and_model[1]], atol=1e-5))

        def resident_seen(churned: threading.Event) -> list[int]:  # each reading of /v1/models meanwhile
            seen = []
            while not churned.is_set():
                found = http("GET", f"{stack.url}/v1/models")[1]["models"]
                seen.append(sum(w["state"] == "resident" for m in found for w in m["workers"]))
            return seen

        # Rounds over every model, two at a time: four models through two places, loaded and evicted,
        # while the registry is read as an operator reads it.
        order = [(r, name) for r in range(3) for name in MODELS]
        churned = threading.Event()
        with ThreadPoolExecutor(3) as pool:
            polled = pool.submit(resident_seen, churned)
            assert all(pool.map(one, order))
            churned.set()
            assert polled.result() and max(polled.result()) <= 2, polled.result()

        listing = http("GET", f"{stack.url}/v1/models")[1]
        workers = [w for m in listing["models"] for w in m["workers"]]
        assert {w["process"] for w in workers} == {"many"}
        assert sum(w["state"] == "resident" for w in workers) <= 2
        scraped = http("GET", f"{stack.url}/metrics")[1]["_text"]
        loads = sum(metric(scraped, "funnel_worker_loads_total", model=name) for name in MODELS)
        evictions = sum(metric(scraped, "funnel_worker_evictions_total", model=name) for name in MODELS)
        assert loads >= len(MODELS) and evictions >= loads - 2
        assert sum(metric(scraped, "funnel_worker_load_seconds_total", model=name) for name in MODELS) > 0

        # A resident model unloaded through the repository API is evicted with no other request; loaded, it
        # is loaded again by the next request.
        resident = [w["model"] for w in workers if w["state"] == "resident"][0]
        assert http("POST", f"{stack.url}/v2/repository/models/{resident}/unload")[0] == 200
        wait_for(lambda: state_of(stack, resident) == "cold", what=f"{resident} evicted once unloaded")
        assert http("POST", f"{stack.url}/v2/repository/models/{resident}/load")[0] == 200
        status, body = ask(stack, resident, vectors)
        assert status == 200 and state_of(stack, resident) == "resident", body


def state_of(stack: Stack, model: str) -> str:
    """The one worker's state of the model, as GET /v1/models lists it."""
    listing = http("GET", f"{stack.url}/v1/models/{model}")[1]
    return listing["workers"][0]["state"]

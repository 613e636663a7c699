"""A bulk job's progress and results as Server-Sent Events (`GET /v1/jobs/<id>/events`), resumed with
Last-Event-ID, refused to another key; the Python client's `events()` and `stream()`."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

from funnel.scripts.stack import Stack
from funnel_client import Client, NotFound

TEXT = "text-embedding"
KEYS = "alice=key-alice,bob=key-bob"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path_factory.mktemp("job-events"),
               web_env={"FUNNEL_API_KEYS": KEYS, "FUNNEL_MAX_ITEMS": "500"}) as running:
        yield running


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} passage {i}: {'brown fox ' * (i % 4)}jumps" for i in range(n)]


def test_a_jobs_events_carry_every_result_once_in_order_and_end_done(stack):
    items = texts(300, "events")
    with Client(stack.url, api_key="key-alice") as alice:
        job = alice.submit_job(TEXT, items)
        results, progress, last = [], [], None
        for name, data in alice.events(job["id"]):
            if name == "page":
                assert data["offset"] == len(results)  # in input order, each once
                results += data["results"]
            elif name == "progress":
                progress.append(data["progress"]["done"])
            last = (name, data)
        assert last[0] == "done" and last[1]["state"] == "done"
        assert len(results) == 300 and progress == sorted(progress)
        sync = alice.predict(TEXT, texts=[items[0], items[299]])["results"]
        np.testing.assert_allclose(results[0]["embedding"], sync[0]["embedding"], atol=1e-5)
        np.testing.assert_allclose(results[299]["embedding"], sync[1]["embedding"], atol=1e-5)
        # resumed from an event's id: the results after it, and the end
        pages = [data for name, data in alice.events(job["id"], offset=250) if name == "page"]
        assert [p["offset"] for p in pages][0] == 250 and sum(len(p["results"]) for p in pages) == 50


def test_last_event_id_resumes_and_another_key_is_refused(stack):
    with Client(stack.url, api_key="key-alice") as alice:
        job = alice.submit_job(TEXT, texts(40, "resume"))
        alice.wait(job["id"], timeout=60)
    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", f"/v1/jobs/{job['id']}/events",
                 headers={"Authorization": "Bearer key-alice", "Last-Event-ID": "30", "Accept": "text/event-stream"})
    body = conn.getresponse().read().decode()
    conn.close()
    pages = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ") and '"offset"' in line]
    assert [p["offset"] for p in pages] == [30] and len(pages[0]["results"]) == 10
    assert "event: done" in body
    with Client(stack.url, api_key="key-bob") as bob, pytest.raises(NotFound):
        list(bob.events(job["id"]))


def test_the_clients_stream_yields_each_item_with_its_index(stack):
    items = texts(200, "client stream")
    with Client(stack.url, api_key="key-alice") as alice:
        streamed = list(alice.stream(TEXT, texts=items))
        whole = alice.predict(TEXT, texts=items[:3])["results"]
    assert sorted(item["index"] for item in streamed) == list(range(200))
    by_index = {item["index"]: item for item in streamed}
    for i in range(3):
        np.testing.assert_allclose(by_index[i]["embedding"], whole[i]["embedding"], atol=1e-5)

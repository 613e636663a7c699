"""/v1 predict streamed: `Accept: text/event-stream` (or `application/x-ndjson`) answers each item as
its job is answered, with its index, then a last event; the errors keep the JSON answer's codes; a
client that leaves mid-stream has its items not yet run dropped."""

from __future__ import annotations

import http.client
import json
import signal
import time

import numpy as np
import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import http as call
from tests.support import wait_for

TEXT = "text-embedding"
MANY = 2000


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path_factory.mktemp("v1-stream"),
               web_env={"FUNNEL_MAX_ITEMS": str(MANY), "FUNNEL_MAX_BODY_MB": "8"}) as running:
        yield running


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} sentence {i}: {'the queue and the batch ' * (i % 4)}end" for i in range(n)]


def open_stream(stack, body: list[str], accept: str):
    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", f"/v1/models/{TEXT}/predict", json.dumps({"texts": body}),
                 {"Content-Type": "application/json", "Accept": accept})
    return conn, conn.getresponse()


def sse_events(response):
    """(event name, data) of each Server-Sent Event, as it arrives."""
    name, data = "message", []
    for raw in response:
        line = raw.decode().rstrip("\n")
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])


def test_many_texts_stream_each_once_the_first_early_equal_to_the_json_answer(stack):
    body = texts(MANY, "stream")
    started = time.monotonic()
    conn, response = open_stream(stack, body, "text/event-stream")
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    first_at, items, last = None, {}, None
    for name, data in sse_events(response):
        if name == "item":
            first_at = first_at or time.monotonic() - started
            assert data["index"] not in items
            items[data["index"]] = data["embedding"]
        else:
            last = (name, data)
    whole_s = time.monotonic() - started
    conn.close()
    assert last == ("done", {"done": True, "model": TEXT, "items": MANY})
    assert sorted(items) == list(range(MANY))  # every item once
    assert first_at < 0.1 * whole_s, (first_at, whole_s)
    sample = list(range(0, MANY, 97))
    status, answer, _ = call("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                             json_body={"texts": [body[i] for i in sample]})
    assert status == 200
    for i, result in zip(sample, answer["results"]):
        np.testing.assert_allclose(items[i], result["embedding"], atol=1e-5)


def test_json_lines_and_the_json_answers_errors(stack):
    conn, response = open_stream(stack, texts(5, "lines"), "application/x-ndjson")
    lines = [json.loads(line) for line in response.read().splitlines()]
    conn.close()
    assert sorted(line["index"] for line in lines[:-1]) == list(range(5)) and lines[-1]["done"] is True
    assert all(len(line["embedding"]) == 384 and "meta" in line for line in lines[:-1])
    conn, response = open_stream(stack, ["fine", ""], "text/event-stream")  # refused before it is queued
    refused = json.loads(response.read())
    conn.close()
    assert response.status == 400 and refused["error"]["code"] == "empty_input"
    status, unstreamed, _ = call("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"texts": ["fine", ""]})
    assert status == 400 and unstreamed["error"]["code"] == refused["error"]["code"]


def test_a_client_gone_after_a_hundred_events_has_the_rest_dropped(stack):
    """The workers are paused (SIGSTOP) at the hundredth event, so that jobs are still queued when the client
    leaves however far ahead of the web tier's writing they had run; resumed once the leaving is marked."""
    client = redis.Redis.from_url(stack.redis_url)
    queue, gone = Keys().queue(TEXT), Keys().gone(TEXT)

    def totals() -> dict[str, float]:
        workers = [w for w in registry.live_workers(client, Keys()) if w.get("model") == TEXT]
        return {name: sum(registry.counter(w, name) for w in workers) for name in ("items", "left")}

    before = totals()
    conn, response = open_stream(stack, texts(MANY, "leaver"), "text/event-stream")
    seen = 0
    try:
        for name, _ in sse_events(response):
            seen += name == "item"
            if seen == 100:
                break
        for worker in stack.workers:
            worker.send_signal(signal.SIGSTOP)
        assert client.llen(queue) > 0, "every job was taken before the client saw its hundredth item"
        conn.sock.close()  # gone, mid-stream
        conn.close()
        wait_for(lambda: client.zcard(gone) > 0, timeout_s=30, what="the web tier to mark the jobs left")
    finally:
        for worker in stack.workers:
            worker.send_signal(signal.SIGCONT)
    wait_for(lambda: client.llen(queue) == 0, timeout_s=60, what="the queue emptied")
    wait_for(lambda: totals()["left"] > before["left"], timeout_s=30, what="the workers to count dropped jobs")
    after = totals()
    assert after["items"] - before["items"] < MANY, (before, after)  # not every item ran

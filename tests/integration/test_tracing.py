"""Traces across the queue hop, against a real OTLP receiver, and request ids through both tiers' logs.

The stack's web tier and worker export to tests/otlp_receiver.py (an HTTP server decoding the
protocol's own protobuf); each request carries a W3C traceparent, so its trace id is known.
"""

from __future__ import annotations

import json
import os

import pytest

from funnel.scripts.stack import Stack
from tests.otlp_receiver import Receiver
from tests.support import http, wait_for

TEXT = "text-embedding"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as running:
        yield running


@pytest.fixture(scope="module")
def stack(model_store, receiver, tmp_path_factory):
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "FUNNEL_LOG_FORMAT": "json"}
    logs = tmp_path_factory.mktemp("tracing-logs")
    # Batches wait a little for company, so that concurrent requests share one.
    with Stack(model_store=model_store, models=[TEXT], web_env={**otel, "FUNNEL_ACCESS_LOG": "1"},
               worker_env={**otel, "FUNNEL_LINGER_MS": "50", "FUNNEL_LOG_LEVEL": "debug"}, log_dir=logs) as running:
        running.logs = logs
        yield running


def traceparent(trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{PARENT_ID}-01"


def test_one_request_is_one_trace_across_web_queue_and_worker(stack, receiver):
    status, answer, headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "traced"},
                                   headers={"traceparent": traceparent()})
    assert status == 200, answer

    def complete(spans):
        mine = [s for s in spans if s.trace_id == TRACE_ID]
        return {"queue", f"predict {TEXT}", "wait"} <= {s.name for s in mine}

    spans = [s for s in receiver.wait_for(complete) if s.trace_id == TRACE_ID]
    by_name = {s.name: s for s in spans}
    request = by_name[f"predict {TEXT}"]
    assert request.service == "funnel-web" and request.parent_id == PARENT_ID  # the client's span is its parent
    assert request.attributes["funnel.model"] == TEXT and request.attributes["funnel.model_version"] == 1
    assert request.attributes["funnel.items"] == 1 and request.attributes["funnel.priority"] == "normal"
    steps = [by_name[step] for step in ("parse", "prepare", "admit", "enqueue", "wait", "render")]
    for step in steps:  # children of the request, one after another
        assert step.parent_id == request.span_id, step.name
    assert all(a.end_ns <= b.start_ns for a, b in zip(steps, steps[1:]))
    assert request.start_ns <= steps[0].start_ns and steps[-1].end_ns <= request.end_ns
    queue = by_name["queue"]
    assert queue.service == "funnel-worker" and queue.parent_id == request.span_id
    # From the job's making until the worker took it (both in whole ms): within the request, and
    # ending after the push began.
    ms = 1_000_000
    assert request.start_ns - ms <= queue.start_ns <= queue.end_ns <= request.end_ns
    assert queue.end_ns + ms >= by_name["enqueue"].start_ns
    # The batch is a trace of its own, linked to the request span of every request it served.
    batches = receiver.wait_for(lambda found: any((TRACE_ID, request.span_id) in s.links for s in found))
    (batch,) = [s for s in batches if (TRACE_ID, request.span_id) in s.links]
    assert batch.name == f"batch {TEXT}" and batch.service == "funnel-worker"
    assert batch.attributes["funnel.batch_size"] >= 1 and batch.attributes["funnel.device"] == "cpu"
    assert batch.attributes["funnel.worker"] and batch.attributes["funnel.model_version"] == 1
    steps = {s.name for s in batches if s.parent_id == batch.span_id and s.trace_id == batch.trace_id}
    assert {"collate", "run", "reply"} <= steps
    assert headers["X-Request-ID"] and answer["meta"]["request_id"] == headers["X-Request-ID"]


def test_a_batch_links_every_request_it_served(stack, receiver):
    from concurrent.futures import ThreadPoolExecutor

    trace_ids = [f"{i:032x}" for i in range(1, 9)]

    def send(trace_id: str) -> int:
        status, _, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": f"t{trace_id}"},
                            headers={"traceparent": traceparent(trace_id)})
        return status

    with ThreadPoolExecutor(len(trace_ids)) as pool:
        assert list(pool.map(send, trace_ids)) == [200] * len(trace_ids)

    def requests_of(spans):
        return {s.trace_id: s.span_id for s in spans if s.name == f"predict {TEXT}" and s.trace_id in trace_ids}

    def all_linked(spans):
        wanted = requests_of(spans)
        linked = {link for s in spans if s.name == f"batch {TEXT}" for link in s.links}
        return len(wanted) == len(trace_ids) and all((t, sid) in linked for t, sid in wanted.items())

    spans = receiver.wait_for(all_linked)
    wanted = requests_of(spans)
    shared = [s for s in spans if s.name == f"batch {TEXT}" and len(set(s.links) & set(wanted.items())) > 1]
    assert shared, "no batch served two of the concurrent requests"
    assert all(s.attributes["funnel.batch_size"] == len(s.links) for s in shared)


def test_a_bulk_job_is_a_span_every_batch_of_its_items_links_to(stack, receiver):
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    texts = [f"bulk item {i}" for i in range(40)]  # more than one batch (the worker's batch size is 32)
    status, answer, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body={"texts": texts},
                             headers={"traceparent": traceparent(trace_id), "X-Request-ID": "bulk-traced"})
    assert status == 202, answer

    def submitted(spans):
        return {f"job {TEXT}", "prepare", "admit", "store"} <= {s.name for s in spans if s.trace_id == trace_id}

    spans = [s for s in receiver.wait_for(submitted) if s.trace_id == trace_id]
    (job,) = [s for s in spans if s.name == f"job {TEXT}"]
    assert job.service == "funnel-web" and job.parent_id == PARENT_ID  # the client's span is its parent
    assert {k: job.attributes.get(k) for k in ("funnel.model", "funnel.model_version", "funnel.job_id",
                                               "funnel.items", "funnel.request_id")} == {
        "funnel.model": TEXT, "funnel.model_version": 1, "funnel.job_id": answer["id"], "funnel.items": len(texts),
        "funnel.request_id": "bulk-traced"}
    for step in ("prepare", "admit", "store"):
        (found,) = [s for s in spans if s.name == step]
        assert found.parent_id == job.span_id, step
    # Every item carried the job span's context: the batches that ran them link to it, once each,
    # the link telling how many of the batch's jobs were the job's items.
    key = (trace_id, job.span_id)

    def ran(found) -> dict[str, int]:
        return {s.span_id: s.link_attributes[s.links.index(key)]["funnel.jobs"]
                for s in found if s.name == f"batch {TEXT}" and key in s.links}

    spans = receiver.wait_for(lambda found: sum(ran(found).values()) >= len(texts), timeout_s=60)
    assert sum(ran(spans).values()) == len(texts)
    batches = [s for s in spans if s.span_id in ran(spans)]
    assert len(batches) >= 2 and all(s.links.count(key) == 1 for s in batches)
    assert all(s.service == "funnel-worker" and s.trace_id != trace_id for s in batches)
    assert all(ran(spans)[s.span_id] <= s.attributes["funnel.batch_size"] for s in batches)
    # and each item's time in the bulk queue is a child of the job span, told by the worker
    queued = receiver.wait_for(lambda found: sum(s.name == "queue" and s.parent_id == job.span_id
                                                 for s in found) >= len(texts))
    assert sum(s.name == "queue" and s.parent_id == job.span_id and s.service == "funnel-worker"
               for s in queued) == len(texts)


def test_a_request_id_is_echoed_and_in_both_tiers_log_lines(stack):
    status, answer, headers = http("POST", f"{stack.url}/v2/models/{TEXT}/infer",
                                   json_body={"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1],
                                                          "data": ["logged"]}]},
                                   headers={"X-Request-ID": "trace-me-42"})
    assert status == 200 and headers["X-Request-ID"] == "trace-me-42"
    status, answer, headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": ""},
                                   headers={"X-Request-ID": "bad one"})  # not acceptable: one is made
    assert status == 400 and headers["X-Request-ID"] != "bad one" and len(headers["X-Request-ID"]) == 16

    def lines(name: str) -> list[dict]:
        text = (stack.logs / name).read_text()
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def logged(name: str, request_id: str) -> bool:
        return any(e.get("request_id") == request_id for e in lines(name))

    worker_logs = [n for n in os.listdir(stack.logs) if n.startswith("worker")]
    assert worker_logs
    for name in [*worker_logs, "web.log"]:  # every line of both tiers one JSON object
        text = (stack.logs / name).read_text().strip().splitlines()
        assert text and all(line.startswith("{") for line in text), name
    wait_for(lambda: logged("web.log", "trace-me-42") and any(logged(n, "trace-me-42") for n in worker_logs),
             what="both tiers' lines about the request")
    assert any(e["message"].startswith("job ") for e in lines(worker_logs[0]) if e.get("request_id") == "trace-me-42")

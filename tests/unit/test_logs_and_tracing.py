"""Log formats with request ids, and the tracing switch, on their own (the stack's traces:
tests/integration/test_tracing.py)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from funnel.common.observability import logs, tracing
from tests.otlp_receiver import Receiver


@pytest.fixture()
def captured(capsys):
    outside = logs.REQUEST_ID.set("")  # whatever request an earlier test left in this context

    def lines(fmt: str) -> list[str]:
        logs.configure("info", fmt)
        log = logging.getLogger("funnel.test")

        async def request(rid: str) -> None:
            logs.REQUEST_ID.set(rid)
            await asyncio.sleep(0)  # the other request runs between: each keeps its own id
            log.info("working on %s", rid)

        async def both() -> None:
            await asyncio.gather(request("req-a"), request("req-b"))

        asyncio.run(both())
        log.info("no request")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed", extra={"request_id": "req-c"})
        return capsys.readouterr().err.splitlines()

    yield lines
    logging.getLogger().handlers.clear()
    logs.REQUEST_ID.reset(outside)


def test_json_lines_are_one_object_each_with_the_request_id(captured):
    entries = [json.loads(line) for line in captured("json") if line.startswith("{")]
    by_message = {e["message"]: e for e in entries}
    assert by_message["working on req-a"]["request_id"] == "req-a"
    assert by_message["working on req-b"]["request_id"] == "req-b"
    assert "request_id" not in by_message["no request"]
    failed = by_message["failed"]
    assert failed["request_id"] == "req-c" and failed["level"] == "error" and "ValueError: boom" in failed["exception"]
    assert failed["time"].endswith("Z") and failed["logger"] == "funnel.test"


def test_text_lines_name_the_request_id(captured):
    lines = captured("text")
    assert any(line.endswith("working on req-a request_id=req-a") for line in lines), lines
    assert any(line.endswith("no request") for line in lines), lines


@pytest.mark.parametrize("given, kept", [("abc-123", True), ("x" * 128, True), ("x" * 129, False),
                                         ("has space", False), ("new\nline", False), ("", False), (None, False),
                                         ("é", False)])
def test_a_request_id_is_kept_only_when_bounded_and_printable(given, kept):
    made = logs.request_id_of(given)
    assert (made == given) is kept
    assert logs.ACCEPTED_ID.match(made)


def test_tracing_is_off_without_an_endpoint_and_on_with_one():
    assert not tracing.enabled({})
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})


def test_off_a_request_has_no_trace_and_its_with_lets_exceptions_through(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setattr(tracing, "_providers", {})
    spans = tracing.Spans("funnel-test")
    assert spans.tracer is None
    trace = spans.request("predict", "m", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert trace is tracing.NO_TRACE and trace.traceparent == ""
    with trace, trace:  # the no-op is stateless: entered twice
        trace.step("parse", model="m")
        trace.annotate(items=3)
    with pytest.raises(KeyError), trace:  # the no-op must not swallow what its block raises
        raise KeyError("inside")


def test_a_trace_tells_its_steps_one_after_another_and_records_an_error_on_both(monkeypatch):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setattr(tracing, "_providers", {})
        spans = tracing.Spans("funnel-test")
        with spans.request("predict", "m", parent, "", "rid-1") as trace:
            trace.step("parse", model="m")
            trace.step("wait")
            carried = trace.traceparent
        with pytest.raises(KeyError), spans.request("predict", "m") as failed:
            failed.step("render")
            raise KeyError("inside")
        tracing.shutdown()
        found = receiver.wait_for(lambda got: len(got) == 5)
    (request,) = [s for s in found if s.name == "predict m" and s.trace_id == "0af7651916cd43dd8448eb211c80319c"]
    assert request.parent_id == "b7ad6b7169203331" and carried == f"00-{request.trace_id}-{request.span_id}-01"
    assert request.attributes == {"funnel.request_id": "rid-1", "funnel.model": "m"} and request.status == 0
    parse, wait = sorted((s for s in found if s.parent_id == request.span_id), key=lambda s: s.start_ns)
    assert (parse.name, wait.name) == ("parse", "wait")
    assert request.start_ns <= parse.start_ns <= parse.end_ns <= wait.start_ns <= wait.end_ns <= request.end_ns
    (other,) = [s for s in found if s.name == "predict m" and s is not request]
    (render,) = [s for s in found if s.name == "render"]
    assert render.parent_id == other.span_id and other.status == render.status == 2  # error, on both


def test_spans_reach_a_receiver_with_the_parent_a_traceparent_names(monkeypatch):
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setattr(tracing, "_providers", {})
        tracer = tracing.tracer("funnel-test")
        assert tracer is not None
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with tracer.start_as_current_span("request", context=tracing.context_of(parent)) as span:
            carried = tracing.traceparent_of(span)
        with tracer.start_as_current_span("batch", links=[tracing.link_to(carried)]):
            pass
        assert tracing.link_to("not a traceparent") is None
        tracing.shutdown()
        spans = receiver.wait_for(lambda found: len(found) == 2)
    request, batch = sorted(spans, key=lambda s: s.name != "request")
    assert request.trace_id == "0af7651916cd43dd8448eb211c80319c" and request.parent_id == "b7ad6b7169203331"
    assert request.service == "funnel-test"
    assert carried == f"00-{request.trace_id}-{request.span_id}-01"
    assert batch.links == [(request.trace_id, request.span_id)] and batch.trace_id != request.trace_id


def test_the_benchmarks_stripped_pipeline_has_no_tracing_left():
    from benchmarks.web_cpu import ROOT, strip_spans

    stripped = strip_spans((ROOT / "web" / "pipeline.py").read_text())
    compile(stripped, "pipeline.py", "exec")
    assert "self.spans.request" not in stripped and "trace.step" not in stripped and "trace.annotate" not in stripped
    assert "trace.traceparent" not in stripped and "with trace" not in stripped
    with pytest.raises(SystemExit):  # a hook of a shape it does not know is not silently kept
        strip_spans("def f(trace, other):\n    with trace, other:\n        a()\n")

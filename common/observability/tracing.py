"""OpenTelemetry traces across the queue hop, configured the standard way (OTEL_* variables).

Tracing is on in a process when an OTLP endpoint is set
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless
OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is "none". Off, `tracer()`
is None, nothing of OpenTelemetry is imported, and a request's trace is
NO_TRACE, whose marks do nothing. On, spans go out through the SDK's batch processor and the
OTLP/HTTP exporter, which read the rest of their settings (headers, timeouts,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*) themselves.

The trace context crosses Redis in the job (`Job.trace`, a W3C traceparent):
the web tier puts its request span's there (a bulk job's submit span's, in
every item), and a worker makes each job's time in the queue a child of it,
and its batch span a span of its own linked to every request (or bulk job) it
served.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, Tracer


class NoTrace:
    """A request's trace when tracing is off: entered, left, stepped and annotated for nothing, so
    the pipeline marks its steps alike whether tracing is on or off. Each is a C function that takes
    any arguments and answers "" (falsy: an exception goes on through its `with`), not a Python
    method as contextlib.nullcontext's are (docs/performance.md); so it is entered as `with trace:`,
    never `with ... as trace:`."""

    __slots__ = ()
    traceparent = ""  # what the request's jobs carry: no trace
    step = annotate = __enter__ = __exit__ = "".format


NO_TRACE = NoTrace()
_providers: dict[tuple[int, str], Any] = {}  # (pid, service) -> its TracerProvider, or None when off


def enabled(environ: os._Environ | dict[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def tracer(service: str) -> Tracer | None:
    """This process's tracer for `service` (the default service.name), or None when tracing is off.

    Made on first use in each process: the exporter's thread would not survive
    gunicorn's fork if the parent made it.
    """
    key = (os.getpid(), service)
    if key not in _providers:
        _providers[key] = _provider(service) if enabled() else None
    provider = _providers[key]
    return None if provider is None else provider.get_tracer("funnel")


def _provider(service: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME, when set, wins over the tier's name; OTEL_RESOURCE_ATTRIBUTES adds to it.
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def shutdown() -> None:
    """Export the spans this process still holds (it is about to exit)."""
    for (pid, _), provider in list(_providers.items()):
        if provider is not None and pid == os.getpid():
            provider.shutdown()


def context_of(traceparent: str, tracestate: str = "") -> Any:
    """The parent context a W3C traceparent (and tracestate) header names; an empty context when
    the header is missing or malformed (the span then starts a new trace)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def traceparent_of(span: Span) -> str:
    """A span's context as a W3C traceparent, for the job that carries it across Redis."""
    found = span.get_span_context()
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


def link_to(traceparent: str, **attributes: Any) -> Link | None:
    """A link to the span a job's traceparent names (None when it names none)."""
    from opentelemetry import trace

    found = trace.get_current_span(context_of(traceparent)).get_span_context()
    return trace.Link(found, _attributes(attributes)) if found.is_valid else None


class Trace:
    """One request's span (or a bulk job's submit's), told as a timeline: each step() ends the step
    before and starts the next, a child of the request's span; leaving the `with` ends both, the
    exception recorded on them when one is raised. With tracing off the pipeline holds NO_TRACE
    instead, whose marks cost a call of a C function each."""

    def __init__(self, tracer: Tracer, *, name: str, traceparent: str, tracestate: str, attributes: dict[str, Any]):
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        self.tracer = tracer
        self.span = tracer.start_span(name, context=context_of(traceparent, tracestate), kind=SpanKind.SERVER,
                                      attributes=_attributes(attributes))
        self.context = trace.set_span_in_context(self.span)
        self.traceparent = traceparent_of(self.span)  # what the request's jobs carry across Redis
        self.current: Span | None = None

    def step(self, name: str, **attributes: Any) -> None:
        """The next step begins (the one before ends); attributes are the request span's."""
        if attributes:
            self.annotate(**attributes)
        if self.current is not None:
            self.current.end()
        self.current = self.tracer.start_span(name, context=self.context)

    def annotate(self, **attributes: Any) -> None:
        """Attributes of the request's span, once they are known."""
        self.span.set_attributes(_attributes(attributes))

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: Any) -> None:
        for span in (self.current, self.span):
            if span is None:
                continue
            if error is not None:  # what start_as_current_span would record
                from opentelemetry.trace import Status, StatusCode

                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()


class Spans:
    """A tier's spans: real ones when tracing is on in this process, else none."""

    def __init__(self, service: str):
        self.tracer = tracer(service)

    def request(self, verb: str, name: str, traceparent: str = "", tracestate: str = "",
                request_id: str = "") -> Trace | NoTrace:
        """A request's trace (its span named `<verb> <name>`), a child of the client's (its
        traceparent header) or a new trace's root; NO_TRACE when tracing is off."""
        if self.tracer is None:
            return NO_TRACE
        return Trace(self.tracer, name=f"{verb} {name}", traceparent=traceparent, tracestate=tracestate,
                     attributes={"request_id": request_id})

    def batch(self, name: str, traceparents: list[str], start_ns: int, end_ns: int,
              steps: dict[str, tuple[int, int]], **attributes: Any) -> None:
        """A batch's span, told once it is over (its steps ran on several threads): the root of a
        trace of its own, linked to each traced job's request (or bulk job) span, with a child per
        step (name -> (start, end), epoch ns)."""
        if self.tracer is None:
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        # One link per span, saying how many of the batch's jobs it sent: a batch of one bulk job's
        # items names that job once, not once an item.
        links = [link for parent, jobs in Counter(filter(None, traceparents)).items()
                 if (link := link_to(parent, jobs=jobs)) is not None]
        span = self.tracer.start_span(name, context=context_of(""), kind=SpanKind.CONSUMER, links=links,
                                      attributes=_attributes(attributes), start_time=start_ns)
        parent = trace.set_span_in_context(span)
        for step, (began, ended) in steps.items():
            self.tracer.start_span(step, context=parent, start_time=began).end(end_time=ended)
        span.end(end_time=end_ns)

    def waited(self, name: str, traceparent: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        """A span already over, from start_ns to end_ns (epoch), a child of the span a job's traceparent
        names: its time in the queue, told by the worker that took it."""
        if self.tracer is None or not traceparent:
            return
        span = self.tracer.start_span(name, context=context_of(traceparent), start_time=start_ns,
                                      attributes=_attributes(attributes))
        span.end(end_time=max(start_ns, end_ns))


def _attributes(given: dict[str, Any]) -> dict[str, Any]:
    """Funnel's attributes, named funnel.<name>."""
    return {f"funnel.{name}": value for name, value in given.items() if value is not None}

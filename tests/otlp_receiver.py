"""An OTLP/HTTP trace receiver on 127.0.0.1 for the tests: it decodes each export with the protocol's
own protobuf messages (opentelemetry-proto) and keeps the spans, as a collector would receive them."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict
    links: list[tuple[str, str]]  # (trace id, span id) of each linked span
    kind: int = 0
    status: int = 0  # its status code: 0 unset, 1 ok, 2 error
    link_attributes: list[dict] = field(default_factory=list)  # each link's attributes, in links' order


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    exports: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and receiver.take(body)
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self, body: bytes) -> bool:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception:
            return False
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(Span(
                        service=resource.get("service.name", ""), name=s.name, trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(), start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, kind=s.kind, status=s.status.code,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        link_attributes=[{a.key: _value(a.value) for a in link.attributes} for link in s.links]))
        with self._lock:
            self.spans.extend(found)
            self.exports += 1
        return True

    def wait_for(self, condition, timeout_s: float = 30.0) -> list[Span]:
        """The spans received, once condition(spans) holds; AssertionError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"spans not received within {timeout_s} s; have {names}")
            time.sleep(0.05)


def _value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None

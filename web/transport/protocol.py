"""HTTP/1 for the web tier: gunicorn runs uvicorn's worker on uvloop, with httptools' parser.

Each gunicorn process runs one event loop; a waiting predict costs a future,
not a thread (docs/performance.md compares the thread-per-request classes this
replaced). The worker class (`Worker`) names the protocol below, which adds
the limits gunicorn and nginx put on a request's head, and writes a response's
head and body in one write.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

HEAD_LIMIT = 64 * 1024  # request line and headers, as nginx's large_client_header_buffers allow at most
HEAD_TIMEOUT_S = 10.0  # a request's head must arrive whole this soon after its first byte (or the connection)
# The scope's Departure: what to do if the client leaves before its response is complete (a predict
# waiting for its answer stops waiting, and its jobs are marked so that no worker runs them).
ON_LEAVE = "funnel.departure"


class Departure:
    """Callbacks run when a request's client leaves before its answer (it may leave before the app has
    read its request: on_leave says so)."""

    __slots__ = ("left", "callbacks")

    def __init__(self) -> None:
        self.left = False
        self.callbacks: list = []

    def on_leave(self, callback) -> bool:
        """Run callback when the client leaves; False, and nothing registered, if it has left already."""
        if self.left:
            return False
        self.callbacks.append(callback)
        return True

    def leave(self) -> None:
        self.left = True
        for callback in self.callbacks:
            callback()


class Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1 protocol with the limits gunicorn and nginx put on a request's head.

    uvicorn keeps every header line it is sent and waits as long as a client likes for
    the end of the headers: without nginx in front, a few slow or endless heads would
    hold memory and connections for good. Here a head over HEAD_LIMIT is answered 431
    and one that takes over HEAD_TIMEOUT_S 408, both as JSON, and the connection closed.
    """

    _head_bytes = 0
    _in_head = False  # between a request's first byte and the end of its headers
    _head_timer: asyncio.TimerHandle | None = None  # from the connection's start, or a head's first read

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._writes = _OneWrite(transport, self.loop)
        self._start_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A head not whole by the end of what came gets its timer; most arrive in one read.
        if self._in_head and self._head_timer is None and not self.transport.is_closing():
            self._start_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._in_head = 0, True

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head()
        self.scope[ON_LEAVE] = Departure()  # type: ignore[literal-required]  # before the app's task starts
        super().on_headers_complete()
        self.cycle.transport = self._writes  # type: ignore[assignment]  # the response's writes, coalesced

    def send_400_response(self, msg: str) -> None:
        if not self.transport.is_closing():  # refused already: _count stopped the parser
            super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:  # the client left before its answer
            departure = cycle.scope.get(ON_LEAVE)
            if isinstance(departure, Departure):
                departure.leave()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > HEAD_LIMIT:
            self._refuse(431, "header_too_large", f"the request line and headers are over {HEAD_LIMIT} bytes")
            raise ValueError("head over the limit")  # stops httptools' parser: nothing more of it is read

    def _start_head(self) -> None:
        self._head_timer = self.loop.call_later(
            HEAD_TIMEOUT_S, self._refuse, 408, "request_timeout",
            f"the request's headers did not arrive within {HEAD_TIMEOUT_S:g} s")

    def _stop_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._stop_head()
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": {"code": code, "message": message}})
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
        self.transport.write(head.encode() + body)
        self.transport.close()


class _OneWrite:
    """The transport as a response sees it: what it writes in one turn of the loop goes out in one write.

    uvicorn writes a response's head and its body with a write each. On loopback (nginx in
    front, or a client on the same host) each write is a trip through the TCP stack and a
    wake-up of the reader: for a predict's small JSON answer the head's write was as dear as
    the body's (docs/performance.md). Held writes go out together at the loop's next turn, or
    before a close; their order is kept.
    """

    __slots__ = ("transport", "loop", "held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self.transport, self.loop = transport, loop
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.held:
            self.loop.call_soon(self.flush)
        self.held.append(data)

    def flush(self) -> None:
        if self.held:
            held, self.held = self.held, []
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class Worker(UvicornWorker):
    """gunicorn's worker class (web/server.py names it)."""

    # No lifespan events (nothing to start: the inbox starts at the first request) and no uvicorn
    # access log: it would format a line per request; FUNNEL_ACCESS_LOG logs predicts.
    CONFIG_KWARGS = {"loop": "uvloop", "http": Protocol, "lifespan": "off", "access_log": False}

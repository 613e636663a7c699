"""One send per answer: gunicorn's HTTP/1 response, with the headers held until the first body bytes.

gunicorn writes a response's headers and its body with two sends. On loopback
(nginx in front, or a client on the same host) each send costs the web
process a full trip through the TCP stack, and for Funnel's small JSON answers
the headers' send was about a seventh of the web tier's CPU per request
(py-spy, text, 32 clients). Held headers go out with the first body bytes, or
on close for an answer without a body. gunicorn 27 made the body's write an
extension point (`_emit_body`) and looks its Response class up at each
request, which `install()` replaces.
"""

from __future__ import annotations

from typing import Any

from gunicorn.http import wsgi


class _Held:
    """Stands in for the socket while gunicorn writes the headers."""

    def __init__(self):
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


class OneSendResponse(wsgi.Response):
    _held = b""

    def send_headers(self):
        if self.headers_sent:
            return
        sock: Any = self.sock  # type: ignore[has-type]  # gunicorn is not typed
        held = self.sock = _Held()
        try:
            super().send_headers()
        finally:
            self.sock = sock
        self._held = held.data

    def _emit_body(self, data):
        held, self._held = self._held, b""
        if held and not self.chunked:
            data = held + data
        elif held:  # a chunk is framed on its own: the headers go first
            self.sock.sendall(held)
        super()._emit_body(data)

    def can_sendfile(self):
        return False  # sendfile() would put the file on the wire before the held headers

    def close(self):
        self.send_headers()  # an answer without a body (HEAD, 204, 304) has them held still
        held, self._held = self._held, b""
        if held:
            self.sock.sendall(held)
        super().close()


def install() -> None:
    """Every gunicorn worker of this process tree answers with OneSendResponse (HTTP/1 only)."""
    wsgi.Response = OneSendResponse  # gunicorn looks it up at each request

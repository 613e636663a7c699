"""web/response.py: headers and body leave in one send; nothing is lost or reordered on the other paths."""

from __future__ import annotations

from gunicorn.config import Config
from gunicorn.http.message import Request
from gunicorn.http.unreader import IterUnreader

from funnel.web.response import OneSendResponse


class Socket:
    def __init__(self):
        self.sends: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))


def request(raw: bytes) -> Request:
    return Request(Config(), IterUnreader([raw]), ("127.0.0.1", 1234))


def respond(method: bytes, status: str, headers: list, body: list[bytes]) -> list[bytes]:
    sock = Socket()
    response = OneSendResponse(request(method + b" / HTTP/1.1\r\nHost: x\r\n\r\n"), sock, Config())
    response.start_response(status, headers)
    for piece in body:
        response.write(piece)
    response.close()
    return sock.sends


def test_a_small_answer_is_one_send_headers_first():
    sends = respond(b"GET", "200 OK", [("Content-Type", "application/json"), ("Content-Length", "11")],
                    [b'{"ok": true}'[:11]])
    assert len(sends) == 1
    head, _, body = sends[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 11" in head and body == b'{"ok": true'


def test_an_answer_without_a_body_still_sends_its_headers():
    for method, status in ((b"HEAD", "200 OK"), (b"GET", "204 No Content")):
        sends = respond(method, status, [("Content-Length", "0")] if method == b"HEAD" else [], [])
        assert len(sends) == 1 and sends[0].startswith(b"HTTP/1.1 " + status.encode()), sends


def test_a_chunked_answer_sends_the_headers_before_its_first_chunk():
    sends = respond(b"GET", "200 OK", [("Content-Type", "text/plain")], [b"one", b"two"])
    wire = b"".join(sends)
    head, _, body = wire.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert body == b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"


def test_files_are_written_not_sent_by_sendfile():
    """sendfile() would put the file on the wire before the held headers; the page's files go
    through write() instead (served whole in tests/integration/test_end_to_end.py)."""
    response = OneSendResponse(request(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Socket(), Config())
    assert not response.can_sendfile()

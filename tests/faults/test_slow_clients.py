"""1,000 clients that dribble their headers or bodies cannot starve the web tier, with or without its front door.

`funnel up` starts nginx in front of gunicorn (scripts/front_door.py). Here a
stack started the same way holds 1,000 connections open on 127.0.0.1, half
stopped in the middle of their headers, half having sent 4 bytes of a
100-byte body, and normal requests are still answered in about their usual
time; nginx then closes the slow ones itself (client_header_timeout /
client_body_timeout, 10 s). Without nginx, each web process holds the same
1,000 and an endless header as sockets on its event loop
(web/transport/protocol.py), and cuts them off itself after as long.
"""

from __future__ import annotations

import resource
import socket
import statistics
import time

import pytest

from funnel.scripts.front_door import nginx_binary
from funnel.scripts.stack import Stack
from tests.support import FAULT_TABLE, Outcome, http, wait_for

TEXT = "text-embedding"
SLOW_CLIENTS = 1000



@pytest.fixture(scope="module")
def stack(model_store):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (requirements/apt.txt)")
    with Stack(model_store=model_store, models=[TEXT], front_door=True) as running:
        yield running


@pytest.fixture(scope="module")
def bare_stack(model_store):
    """The web tier itself on 127.0.0.1, no nginx in front."""
    with Stack(model_store=model_store, models=[TEXT]) as running:
        yield running


def timed_request(stack) -> tuple[int, float]:
    started = time.monotonic()
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                           json_body={"text": "A man is eating food."}, timeout=30)
    assert status != 200 or len(body["embedding"]) == 384
    return status, time.monotonic() - started


def open_slow_clients(port: int, count: int) -> list[socket.socket]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    head = f"POST /v1/models/{TEXT}/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    sockets = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:  # the whole header, announcing a body it never sends
            sock.sendall(head + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te")
        else:  # half a header, then nothing
            sock.sendall(head + b"Content-Ty")
        sockets.append(sock)
    return sockets


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096) is not None  # b"" (closed) or nginx's 408 answer
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


@pytest.mark.parametrize("front", ["nginx", "none"])
def test_slow_clients_do_not_starve_normal_requests(request, front):
    stack = request.getfixturevalue("stack" if front == "nginx" else "bare_stack")
    before = [timed_request(stack)[1] for _ in range(5)]
    sockets = open_slow_clients(stack.port, SLOW_CLIENTS)
    outcome = Outcome()
    try:
        during = []
        for _ in range(20):
            status, seconds = timed_request(stack)
            outcome.add(status, seconds)
            during.append(seconds)
        assert outcome.ok == 20, outcome.statuses
        usual, now = statistics.median(before), statistics.median(during)
        print(f"\nnormal request with {SLOW_CLIENTS} slow clients open: median {now * 1000:.0f} ms "
              f"(before: {usual * 1000:.0f} ms), slowest {max(during) * 1000:.0f} ms")
        assert now < max(5 * usual, 0.5), (usual, now)
        # Past the timeouts nginx (or the asgi front) closes them: the slow clients cost nothing for long.
        wait_for(lambda: all(closed_by_server(s) for s in sockets), timeout_s=30, what="slow clients cut off")
    finally:
        for sock in sockets:
            sock.close()
    FAULT_TABLE.append((f"{SLOW_CLIENTS} slow clients open, 20 normal requests, front door: {front}", outcome, 0))


def test_without_nginx_an_endless_header_is_refused_and_others_answered(bare_stack):
    sock = socket.create_connection(("127.0.0.1", bare_stack.port), timeout=5)
    try:
        sock.sendall(f"POST /v1/models/{TEXT}/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        for _ in range(1000):  # 1,000 header lines of 1 KiB: past the 64 KiB limit early
            sock.sendall(b"X-Filler: " + b"a" * 1014 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused and closed while we were still sending
    try:
        answer = sock.recv(4096)  # long before the 10 s head timeout: TimeoutError fails the test
    except ConnectionResetError:
        answer = b""  # closed with our unread lines in its buffer: the 431 was dropped with them
    finally:
        sock.close()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert timed_request(bare_stack)[0] == 200


def test_without_nginx_a_head_stalled_on_a_kept_alive_connection_gets_408(bare_stack):
    body = b'{"text": "first"}'
    head = f"POST /v1/models/{TEXT}/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    with socket.create_connection(("127.0.0.1", bare_stack.port), timeout=30) as sock:
        sock.sendall(head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        first = sock.recv(65536)
        while b"\r\n\r\n" not in first or len(first.partition(b"\r\n\r\n")[2]) < content_length(first):
            first += sock.recv(65536)  # the head and the body may come in two reads
        assert first.startswith(b"HTTP/1.1 200"), first[:100]
        sock.sendall(head + b"Content-Ty")  # the second request stops in its headers
        started = time.monotonic()
        second = sock.recv(65536)
    assert second.startswith(b"HTTP/1.1 408") and b"request_timeout" in second, second[:200]
    assert 9 < time.monotonic() - started < 15


def content_length(answer: bytes) -> int:
    head = answer.partition(b"\r\n\r\n")[0].lower()
    return int(head.partition(b"content-length:")[2].split(b"\r\n")[0])

"""A TCP proxy to a real Redis that loses one answer: a command run, its answer never arriving,
as when Redis or the network dies mid-reply (what a client's retry must not turn into a second run);
or that is down a while, as Redis is through a failover, for its clients alone."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    """Passes everything both ways until armed; armed, it closes the client's connection instead of
    passing on Redis's next answer (with `after`, the next answer once the client has sent bytes
    holding `after`, such as b"EXEC")."""

    def __init__(self, redis_port: int):
        self.redis_port = redis_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.after: bytes | None = None
        self._sent = threading.Event()  # the client has sent `after`: cut the next answer
        self.cuts = 0
        self.down = threading.Event()  # every connection closed, new ones closed at once, until up()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, after: bytes | None = None) -> None:
        self.after = after
        self._sent.clear()
        self.armed.set()

    def go_down(self) -> None:
        self.down.set()
        for end in list(self._open):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        self.down.clear()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:  # closed
                return
            if self.down.is_set():
                downstream.close()
                continue
            self._open.append(downstream)
            upstream = socket.create_connection(("127.0.0.1", self.redis_port))
            threading.Thread(target=self._pump, args=(downstream, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not answers and self.after is not None and self.after in data:
                    self._sent.set()
                if answers and self.armed.is_set() and (self.after is None or self._sent.is_set()):
                    self.armed.clear()
                    self.cuts += 1
                    break
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()

"""A round trip to Redis on a connection each thread holds: commands written at once, answers read in order.

What redis-py's non-transactional Pipeline does (the same connection, retry and
per-command errors) without its per-call machinery, which cost twice the round
trip's own CPU, and without taking a connection from the pool each time (a lock
and a poll() for data left unread). The web's event loop (web/queueing/outbox.py)
and each inbox listener are one thread each, as are a worker's taker and replier
(their scripts: common/link/lua_scripts.py's Runner), so each holds a connection of
its own. Not on Redis Cluster: its pipeline routes each command to the key's node.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import hiredis
import redis


class Line:
    def __init__(self, client: redis.Redis, resend: bool = True):
        """resend: whether a round trip whose connection fails while its answers are read is sent
        again (the client's retry): not for commands that must not run twice, which the failed
        one may already have run (an outbox's pushes); the connection error is raised then."""
        self.pool = client.connection_pool
        self.resend = resend
        self._local = threading.local()

    def exchange(self, commands: list[tuple]) -> list[Any]:
        """Each command's answer, or its own ResponseError; a connection error raised (after the
        client's retry)."""
        connection = self._connection()
        retry = connection.retry.call_with_retry
        try:
            if self.resend:
                return retry(lambda: _read(_send(connection, commands), len(commands)),
                             lambda _error: connection.disconnect())
            return _read(retry(lambda: _send(connection, commands), lambda _error: connection.disconnect()),
                         len(commands))
        except BaseException:
            connection.disconnect()  # answers may be left unread: the next round trip starts afresh
            raise

    def _connection(self):
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # a forked gunicorn worker takes its own
            local.connection, local.pid = self.pool.get_connection(), os.getpid()
        return local.connection


def _send(connection, commands: list[tuple]):
    # connect() itself, not send's implicit reconnect: through Sentinel only connect() asks where
    # the primary is now; a no-op while connected.
    connection.connect()
    connection.send_packed_command(_packed(connection, commands))
    return connection


def _packed(connection, commands: list[tuple]) -> list[bytes]:
    """The commands in Redis's protocol, by hiredis's packer itself: redis-py's wrapper walks every
    argument in Python first (a push's 35 arguments: 11.6 µs against 4.5)."""
    try:
        return [b"".join([hiredis.pack_command(command) for command in commands])]
    except TypeError:  # an argument hiredis does not take (a memoryview): redis-py's way, and its errors
        return connection.pack_commands(commands)


def _read(connection, count: int) -> list[Any]:
    answers: list[Any] = []
    for _ in range(count):
        try:
            answers.append(connection.read_response())
        except redis.ResponseError as error:  # this command's own error (NOSCRIPT among them); read on
            answers.append(error)
    return answers

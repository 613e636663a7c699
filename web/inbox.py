"""One reply inbox per web process, read by one thread for every waiting request.

Blocking per request costs each request a BLPOP round trip and a pooled
connection held while it waits. Instead, every job of this process names the
same reply list; a listener thread pops whatever replies are there in one
round trip (BRPOP, then RPOP COUNT for the rest, pipelined) and hands each to
the request that waits for its job id.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable
from queue import Empty, SimpleQueue

import redis

from funnel.common.errors import Timeout, Unavailable
from funnel.common.keys import Keys
from funnel.common.wire import Reply, WireError, decode_reply, now_ms

log = logging.getLogger(__name__)

POP_COUNT = 512      # replies taken per round trip beyond the first
IDLE_BLOCK_S = 1.0   # BRPOP timeout when nothing arrives: how often the thread looks up
RETRY_S = 0.2        # pause after a Redis error before listening again


class Inbox:
    def __init__(self, client: redis.Redis, keys: Keys, on_unclaimed: Callable[[], None] = lambda: None):
        self.client, self.keys, self.on_unclaimed = client, keys, on_unclaimed
        self._waiting: dict[str, SimpleQueue] = {}
        self._started_in: int | None = None  # pid: a forked gunicorn worker starts its own thread
        self._start_lock = threading.Lock()
        self._closed = threading.Event()
        self.key = ""

    def expect(self, job_ids: list[str]) -> SimpleQueue:
        """Register jobs before they are queued, so no reply can arrive unclaimed."""
        self._ensure_listening()
        waiter: SimpleQueue = SimpleQueue()
        for job_id in job_ids:
            self._waiting[job_id] = waiter
        return waiter

    def collect(self, waiter: SimpleQueue, job_ids: list[str], deadline: int) -> list[Reply]:
        """The replies of job_ids in their order; Timeout at the deadline."""
        position = {job_id: i for i, job_id in enumerate(job_ids)}
        replies: list[Reply | None] = [None] * len(job_ids)
        for _ in job_ids:
            try:
                got = waiter.get(timeout=max(0.0, (deadline - now_ms()) / 1000))
            except Empty:
                raise Timeout("no reply before the deadline") from None
            if isinstance(got, Exception):
                raise got
            replies[position[got.id]] = got
        return replies  # type: ignore[return-value]

    def forget(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._waiting.pop(job_id, None)

    def _ensure_listening(self) -> None:
        if self._started_in == os.getpid():
            return
        with self._start_lock:
            if self._started_in != os.getpid():
                self._waiting.clear()  # a fork inherits the parent's map, not its thread
                self.key = self.keys.reply(f"web-{uuid.uuid4().hex}")
                threading.Thread(target=self._listen, name="reply-inbox", daemon=True).start()
                self._started_in = os.getpid()

    def _listen(self) -> None:
        key = self.key
        while not self._closed.is_set():
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.brpop([key], timeout=IDLE_BLOCK_S)
                pipe.rpop(key, POP_COUNT)
                first, rest = pipe.execute()
            except Exception as exc:  # never let the thread die: every request of the process waits on it
                if not isinstance(exc, redis.RedisError):
                    log.exception("reply inbox %s: unexpected error, listening again", key)
                self._fail_waiting(Unavailable(f"queue unavailable: {type(exc).__name__}"))
                self._closed.wait(RETRY_S)
                continue
            if first:
                self._route([first[1], *(rest or [])])

    def close(self) -> None:
        """Stop listening (tests; a web process just exits)."""
        self._closed.set()

    def _route(self, payloads: list[bytes]) -> None:
        for data in payloads:
            try:
                reply = decode_reply(data)
            except WireError as exc:
                log.warning("dropped an undecodable reply in %s: %s", self.key, exc)
                continue
            waiter = self._waiting.pop(reply.id, None)  # popped: a second answer finds nobody
            if waiter is not None:
                waiter.put(reply)
            else:  # its request gave up (deadline) and left, or the job was answered twice
                self.on_unclaimed()

    def _fail_waiting(self, error: Exception) -> None:
        """Redis went away: replies may be lost with it, so nobody waits for them."""
        for waiter in set(self._waiting.values()):
            waiter.put(error)

"""One reply inbox per web process, read by one thread for every waiting request.

Every job of this process names the same reply list; a listener thread pops
whatever replies are there in one round trip (BRPOP, then RPOP COUNT for the
rest, pipelined: common/link/line.py) and hands each to the request on the event
loop that waits for its job id, so a waiting request costs a future, not a
connection or a thread (docs/performance.md has the figures against a BLPOP
per request).

The inbox is one list per model, `funnel:reply:{<model>}:web-<hex>`, each read
by a thread of its own, started at the process's first request for the model:
a worker's reply MULTI writes the inbox with its model's in-flight list, so on
Redis Cluster the inbox must be in the model's slot, and a BRPOP may not span
slots. One listener per list keeps each round trip at today's two commands on
a single Redis too (one BRPOP over several lists would need an RPOP for each).

A request may also borrow another's job: its cached item computed for an earlier request
(web/queueing/cache_plan.py), whose reply the worker sends to every list waiting on the item. Any
number of requests may borrow one job, and its reply may come before the borrower has learnt the
job's id: a reply nobody waits for is kept a while (RECENT), and a borrower looks there first.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import uuid
from collections.abc import Callable

import redis

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, WireError, decode_reply, now_ms
from funnel.common.errors import Timeout, queue_unavailable
from funnel.common.link.line import Line

log = logging.getLogger(__name__)

POP_COUNT = 512      # replies taken per round trip beyond the first
IDLE_BLOCK_S = 1.0   # BRPOP timeout when nothing arrives: how often the thread looks up
RETRY_S = 0.2        # pause after a Redis error before listening again
RECENT = 1024        # replies nobody waited for, kept for a borrower that learns their job late


class Waiter:
    """Where a request on the event loop waits: the listener thread's put() wakes it.

    Made on the loop's thread; put() may be called from any thread. Its future is done
    once `count` replies are in, or at the first error.
    """

    def __init__(self, count: int):
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[list[Reply]] = self.loop.create_future()
        self.count = count
        self.got: list[Reply] = []
        self.each: Callable[[Reply], None] | None = None  # a streamed request's: each reply as it comes

    def follow(self, each: Callable[[Reply], None]) -> None:
        """each(reply) for every reply, those in already first, as they come (on the loop's thread): a
        streamed request's items are answered as their jobs are."""
        for reply in self.got:
            each(reply)
        self.each = each

    def put(self, item: Reply | Exception) -> None:
        self.loop.call_soon_threadsafe(self._add, item)

    def _add(self, item: Reply | Exception) -> None:
        if self.future.done():  # timed out, or failed before
            return
        if isinstance(item, Exception):
            self.future.set_exception(item)
            return
        self.got.append(item)
        if self.each is not None:
            self.each(item)
        if len(self.got) == self.count:
            self.future.set_result(self.got)

    def narrow(self, count: int) -> None:
        """Wait for `count` replies only (some jobs were never queued); done now if they are in."""
        self.count = count
        if count and len(self.got) >= count and not self.future.done():
            self.future.set_result(self.got)

    def expire(self) -> None:
        if not self.future.done():
            self.future.set_exception(Timeout("no reply before the deadline"))


class Inbox:
    def __init__(self, client: redis.Redis, keys: Keys, on_unclaimed: Callable[[], None] = lambda: None):
        self.client, self.keys, self.on_unclaimed = client, keys, on_unclaimed
        self._line = None if keys.cluster else Line(client)  # each listener thread holds a connection
        self._waiting: dict[str, tuple[str, Waiter]] = {}  # job id -> (model, its request's waiter)
        self._borrowed: dict[str, list[tuple[str, Waiter]]] = {}  # another's job id -> its borrowers
        self._recent: collections.OrderedDict[str, Reply] = collections.OrderedDict()  # unclaimed, newest last
        self._routing = threading.Lock()  # a borrower's look at _recent against the listener's routing
        # Set once a request of a cached model runs: every reply is then kept a while, since one
        # this process's request awaited may be borrowed by another just after.
        self.lending = False
        self._inboxes: dict[str, str] = {}  # model -> this process's reply list for it
        self._started_in: int | None = None  # pid: a forked gunicorn worker starts its own threads
        self._start_lock = threading.Lock()
        self._closed = threading.Event()
        self._name = ""  # "web-<hex>", this process's part of its reply lists' names

    def key(self, model: str) -> str:
        """The reply list this process's jobs of `model` name, listened to from its first use."""
        self._ensure_listening(model)
        return self._inboxes[model]

    def expect(self, model: str, job_ids: list[str]) -> Waiter:
        """Register jobs before they are queued, so no reply can arrive unclaimed; their waiter.

        Called on the event loop: the waiter wakes the loop's request."""
        self._ensure_listening(model)
        waiter = Waiter(len(job_ids))
        for job_id in job_ids:
            self._waiting[job_id] = (model, waiter)
        return waiter

    async def collect(self, waiter: Waiter, job_ids: list[str], deadline: int) -> list[Reply]:
        """The replies of job_ids in their order; Timeout at the deadline (one timer, no thread)."""
        timer = waiter.loop.call_later(max(0.0, (deadline - now_ms()) / 1000), waiter.expire)
        try:
            return _in_order(job_ids, await waiter.future)
        finally:
            timer.cancel()

    def forget(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._waiting.pop(job_id, None)

    def borrow(self, model: str, job_ids: list[str]) -> Waiter:
        """Wait for the replies of jobs other requests queued (each id once); their waiter."""
        waiter = Waiter(len(job_ids))
        with self._routing:
            for job_id in job_ids:
                came = self._recent.get(job_id)  # kept: other requests here may borrow it late too
                if came is not None:
                    waiter.put(came)
                else:
                    self._borrowed.setdefault(job_id, []).append((model, waiter))
        return waiter

    def give_back(self, job_ids: list[str], waiter: Waiter) -> None:
        """Stop waiting for borrowed jobs (answered, or given up)."""
        with self._routing:
            for job_id in job_ids:
                left = [entry for entry in self._borrowed.get(job_id, ()) if entry[1] is not waiter]
                if left:
                    self._borrowed[job_id] = left
                else:
                    self._borrowed.pop(job_id, None)

    def _ensure_listening(self, model: str) -> None:
        if self._started_in == os.getpid() and model in self._inboxes:
            return
        with self._start_lock:
            if self._started_in != os.getpid():
                self._waiting.clear()  # a fork inherits the parent's maps, not its threads
                self._borrowed.clear()
                self._recent.clear()
                self._inboxes = {}
                self._name = f"web-{uuid.uuid4().hex}"
                self._started_in = os.getpid()
            if model not in self._inboxes:
                key = self.keys.reply(model, self._name)
                threading.Thread(target=self._listen, args=(model, key), name=f"reply-inbox-{model}",
                                 daemon=True).start()
                self._inboxes[model] = key

    def _listen(self, model: str, key: str) -> None:
        while not self._closed.is_set():
            try:
                payloads = self._pop(key)
            except Exception as exc:  # never let the thread die: every request of the process waits on it
                if not isinstance(exc, redis.RedisError):
                    log.exception("reply inbox %s: unexpected error, listening again", key)
                self._fail_waiting(model, queue_unavailable(exc))
                self._closed.wait(RETRY_S)
                continue
            if payloads:
                self._route(key, payloads)

    def _pop(self, key: str) -> list[bytes]:
        """Replies in `key`: BRPOP for the first, RPOP COUNT for the rest, in one round trip."""
        if self._line is None:  # Redis Cluster: its pipeline finds the key's node
            pipe = self.client.pipeline(transaction=False)
            pipe.brpop([key], timeout=IDLE_BLOCK_S)
            pipe.rpop(key, POP_COUNT)
            first, rest = pipe.execute()
        else:
            first, rest = self._line.exchange([("BRPOP", key, IDLE_BLOCK_S), ("RPOP", key, POP_COUNT)])
            for answer in (first, rest):
                if isinstance(answer, Exception):
                    raise answer
        return [first[1], *(rest or [])] if first else []

    def close(self) -> None:
        """Stop listening (tests; a web process just exits)."""
        self._closed.set()

    def _route(self, key: str, payloads: list[bytes]) -> None:
        for data in payloads:
            try:
                reply = decode_reply(data)
            except WireError as exc:
                log.warning("dropped an undecodable reply in %s: %s", key, exc)
                continue
            waiting = self._waiting.pop(reply.id, None)  # popped: a second answer finds nobody
            if waiting is not None:
                waiting[1].put(reply)
            if waiting is None or self.lending:
                with self._routing:
                    borrowers = self._borrowed.pop(reply.id, ())
                    for _, waiter in borrowers:
                        waiter.put(reply)
                    self._keep(reply)  # for a borrower yet to learn its job
                if waiting is None and not borrowers:  # its request gave up (deadline) and left, or the
                    self.on_unclaimed()                # job was answered twice, or a borrower is late

    def _keep(self, reply: Reply) -> None:
        self._recent[reply.id] = reply
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)

    def _fail_waiting(self, model: str, error: Exception) -> None:
        """Redis (on a cluster, the model's node) went away: replies may be lost with it, so nobody
        waits for them."""
        with self._routing:
            borrowers = [entry for entries in self._borrowed.values() for entry in entries]
        for waiter in {waiter for of, waiter in [*self._waiting.values(), *borrowers] if of == model}:
            waiter.put(error)


def _in_order(job_ids: list[str], replies: list[Reply]) -> list[Reply]:
    position = {job_id: i for i, job_id in enumerate(job_ids)}
    return sorted(replies, key=lambda reply: position[reply.id])

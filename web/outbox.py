"""One outbox per web process: the pushes of concurrent requests go to Redis in one pipeline.

A request hands its push (the gateway's script, its keys and arguments) to
the outbox and waits for the script's answer; one sender thread (a greenlet
under gevent) takes whatever pushes are waiting, sends them as one
non-transactional pipeline (one write, one read) and hands each request its
own answer or error. Each push stays one atomic script run in Redis, so the
shedding decision and the queue limit are exactly those of a lone push.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

import redis
from redis.commands.core import Script

from funnel.web.line import Line

log = logging.getLogger(__name__)

MAX_PIPELINE = 256  # pushes sent in one round trip at most


class _Push:
    __slots__ = ("keys", "args", "done", "result")

    def __init__(self, keys: list[str], args: list, done: Callable[[], Any]):
        self.keys, self.args = keys, args
        self.done = done  # called once the result is in
        self.result: Any = None


class Outbox:
    def __init__(self, client: redis.Redis, script: Script):
        self.client, self.script = client, script
        self.line = Line(client)  # the sender thread's connection, and the event loop's
        self._pending: SimpleQueue[_Push] = SimpleQueue()
        self._started_in: int | None = None  # pid: a forked gunicorn worker starts its own sender
        self._start_lock = threading.Lock()
        self._tick: list[_Push] = []  # the event loop's pushes, sent at the end of its tick

    def push(self, keys: list[str], args: list, timeout_s: float) -> Any:
        """The script's answer for these keys and arguments; its error raised here."""
        self._ensure_sending()
        sent = threading.Event()
        push = _Push(keys, args, sent.set)
        self._pending.put(push)
        if not sent.wait(timeout_s):
            raise redis.TimeoutError("the outbox did not send in time")
        return _answer(push)

    async def push_async(self, keys: list[str], args: list) -> Any:
        """push() for a request on the event loop (web/asgi.py), with no sender thread.

        The pushes of one tick of the loop go out together in one pipeline, sent by the
        loop's thread once the tick's ready callbacks have run: one blocking round trip
        per tick, against one thread wake-up per push (or per batch) for the sender.
        """
        loop = asyncio.get_running_loop()
        sent = loop.create_future()
        if not self._tick:
            loop.call_soon(self._send_tick)
        push = _Push(keys, args, lambda: _resolve(sent))
        self._tick.append(push)
        await sent
        return _answer(push)

    def _send_tick(self) -> None:
        batch, self._tick = self._tick, []
        for start in range(0, len(batch), MAX_PIPELINE):
            self._send(batch[start:start + MAX_PIPELINE])

    def _ensure_sending(self) -> None:
        if self._started_in == os.getpid():
            return
        with self._start_lock:
            if self._started_in != os.getpid():
                self._pending = SimpleQueue()  # a fork inherits the parent's queue, not its thread
                threading.Thread(target=self._send_forever, name="outbox", daemon=True).start()
                self._started_in = os.getpid()

    def _send_forever(self) -> None:
        while True:
            batch = [self._pending.get()]
            try:
                while len(batch) < MAX_PIPELINE:
                    batch.append(self._pending.get_nowait())
            except Empty:
                pass
            self._send(batch)

    def _send(self, batch: list[_Push]) -> None:
        try:
            results = self._run(batch)
            missing = [i for i, r in enumerate(results) if isinstance(r, redis.exceptions.NoScriptError)]
            if missing:  # a restarted (or flushed) Redis forgot the script: load it, run those again
                self.client.script_load(self.script.script)
                for i, result in zip(missing, self._run([batch[i] for i in missing])):
                    results[i] = result
        except Exception as exc:  # the whole round trip failed: every push in it hears so
            if not isinstance(exc, redis.RedisError):
                log.exception("outbox: unexpected error sending %d pushes", len(batch))
            results = [exc] * len(batch)
        for push, result in zip(batch, results):
            push.result = result
            push.done()

    def _run(self, batch: list[_Push]) -> list[Any]:
        """One round trip: every push's EVALSHA written at once, their answers read in order.

        EVALSHA itself, not Script.__call__, which asks SCRIPT EXISTS first.
        """
        return self.line.exchange([("EVALSHA", self.script.sha, len(push.keys), *push.keys, *push.args)
                                   for push in batch])


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # done: its request was cancelled meanwhile
        future.set_result(None)


def _answer(push: _Push) -> Any:
    if isinstance(push.result, Exception):
        raise push.result
    return push.result

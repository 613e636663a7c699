"""One outbox per web process: the pushes of concurrent requests go to Redis in one pipeline.

A request hands its push (the gateway's script, its keys and arguments) to
the outbox and waits for the script's answer; one sender thread (a greenlet
under gevent) takes whatever pushes are waiting, sends them as one
non-transactional pipeline (one write, one read) and hands each request its
own answer or error. Each push stays one atomic script run in Redis, so the
shedding decision and the queue limit are exactly those of a lone push.
"""

from __future__ import annotations

import logging
import os
import threading
from queue import Empty, SimpleQueue
from typing import Any

import redis
from redis.commands.core import Script

log = logging.getLogger(__name__)

MAX_PIPELINE = 256  # pushes sent in one round trip at most


class _Push:
    __slots__ = ("keys", "args", "done", "result")

    def __init__(self, keys: list[str], args: list):
        self.keys, self.args = keys, args
        self.done = threading.Event()
        self.result: Any = None


class Outbox:
    def __init__(self, client: redis.Redis, script: Script):
        self.client, self.script = client, script
        self._pending: SimpleQueue[_Push] = SimpleQueue()
        self._started_in: int | None = None  # pid: a forked gunicorn worker starts its own sender
        self._start_lock = threading.Lock()

    def push(self, keys: list[str], args: list, timeout_s: float) -> Any:
        """The script's answer for these keys and arguments; its error raised here."""
        self._ensure_sending()
        push = _Push(keys, args)
        self._pending.put(push)
        if not push.done.wait(timeout_s):
            raise redis.TimeoutError("the outbox did not send in time")
        if isinstance(push.result, Exception):
            raise push.result
        return push.result

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
            push.done.set()

    def _run(self, batch: list[_Push]) -> list[Any]:
        # EVALSHA itself, not Script.__call__: a pipeline given a Script asks SCRIPT EXISTS first,
        # a second round trip every time.
        pipe = self.client.pipeline(transaction=False)
        for push in batch:
            pipe.evalsha(self.script.sha, len(push.keys), *push.keys, *push.args)
        return pipe.execute(raise_on_error=False)

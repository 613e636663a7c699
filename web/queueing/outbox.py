"""One outbox per web process: the pushes of one turn of the event loop go to Redis together.

A request hands its push (the push script's keys and arguments) to the outbox
and awaits the script's answer. Once the loop's ready callbacks have run, the
pushes they made go out in one round trip, each still one atomic script run
in Redis, so the shedding decision and the queue limit are those of a lone
push. On a single Redis (or through Sentinel) the round trip is one write and
one read on the loop's own connection (queueing/line.py); on a Redis Cluster,
whose nodes each hold some models' queues, each push is its own script call
through the cluster client, which finds the node of its model's slot.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis
from redis.commands.core import Script

from funnel.web.queueing.line import Line

log = logging.getLogger(__name__)

MAX_PIPELINE = 256  # pushes sent in one round trip at most


class _Push:
    __slots__ = ("keys", "args", "sent", "result")

    def __init__(self, keys: list[str], args: list, sent: asyncio.Future):
        self.keys, self.args, self.sent = keys, args, sent
        self.result: Any = None


class Outbox:
    def __init__(self, client: redis.Redis, script: Script, cluster: bool = False):
        self.client, self.script = client, script
        self._run = self._run_each if cluster else self._run_together
        self.line = None if cluster else Line(client)
        self._tick: list[_Push] = []  # this turn's pushes, sent once its ready callbacks have run

    async def push(self, keys: list[str], args: list) -> Any:
        """The script's answer for these keys and arguments; its error raised here."""
        loop = asyncio.get_running_loop()
        if not self._tick:
            loop.call_soon(self._send_tick)
        push = _Push(keys, args, loop.create_future())
        self._tick.append(push)
        await push.sent
        if isinstance(push.result, Exception):
            raise push.result
        return push.result

    def _send_tick(self) -> None:
        batch, self._tick = self._tick, []
        for start in range(0, len(batch), MAX_PIPELINE):
            self._send(batch[start:start + MAX_PIPELINE])

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
            if not push.sent.done():  # done: its request was cancelled meanwhile
                push.sent.set_result(None)

    def _run_together(self, batch: list[_Push]) -> list[Any]:
        """One round trip: every push's EVALSHA written at once, their answers read in order.

        EVALSHA itself, not Script.__call__, which asks SCRIPT EXISTS first.
        """
        assert self.line is not None
        return self.line.exchange([("EVALSHA", self.script.sha, len(push.keys), *push.keys, *push.args)
                                   for push in batch])

    def _run_each(self, batch: list[_Push]) -> list[Any]:
        """Redis Cluster: each push to its model's node (redis-py's cluster pipeline refuses EVALSHA)."""
        results: list[Any] = []
        for push in batch:
            try:
                results.append(self.client.evalsha(self.script.sha, len(push.keys), *push.keys, *push.args))
            except redis.ResponseError as error:  # this push's own error (NOSCRIPT among them)
                results.append(error)
        return results

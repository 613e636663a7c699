"""One outbox per web process: the pushes of one turn of the event loop go to Redis together.

A request hands its push (the push script's keys and arguments) to the outbox
and awaits the script's answer. Once the loop's ready callbacks have run, the
pushes they made go out in one round trip, each still one atomic script run
in Redis, so the shedding decision and the queue limit are those of a lone
push. On a single Redis (or through Sentinel) the round trip is one write and
one read on the loop's own connection (common/link/line.py); on a Redis Cluster,
whose nodes each hold some models' queues, one such round trip to each node
that holds a push's model, node after node. A round trip whose connection
fails once written is never sent again: its pushes may have run.

With replicas to wait for (FUNNEL_JOB_REPLICAS), a round trip ends with a
WAIT on its own connection (WAIT counts that connection's writes; on a
cluster, each node's round trip ends with its own), and a push
that wrote on fewer replicas than that is answered NotReplicated. A WAIT may
hold its round trip up to REPLICA_WAIT_MS, so those round trips run on a
thread of the outbox's own (_Sender), never on the event loop: the pushes
handed to it while one waits go together in its next.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.commands.core import Script

from funnel.common.bulk.job_store import REPLICA_WAIT_MS
from funnel.common.errors import NotReplicated
from funnel.common.link.connection import node_client
from funnel.common.link.line import Line

log = logging.getLogger(__name__)

MAX_PIPELINE = 256  # pushes sent in one round trip at most


class _Push:
    __slots__ = ("keys", "args", "sent", "result")

    def __init__(self, keys: list[str], args: list, sent: asyncio.Future):
        self.keys, self.args, self.sent = keys, args, sent
        self.result: Any = None


class Outbox:
    def __init__(self, client: redis.Redis, script: Script, cluster: bool = False, replicas: int = 0,
                 wrote: Callable[[Any], bool] = lambda answer: True):
        """`replicas`: how many replicas must hold a push's writes; `wrote(answer)`: whether the
        script's answer says it wrote (a push it refused needs no replica)."""
        self.client, self.script, self.replicas, self.wrote = client, script, replicas, wrote
        if cluster:
            self._run = self._run_by_node
        else:
            self._run = self._run_together_and_wait if replicas else self._run_together
        # Never sent again once written (a push run twice queues its jobs twice): lines, not the
        # clients' own retries, on one Redis and to each node of a cluster.
        self.line = None if cluster else Line(client, resend=False)
        self._node_lines: dict[redis.Redis, Line] = {}
        self._tick: list[_Push] = []  # this turn's pushes, sent once its ready callbacks have run
        self._sender: _Sender | None = None  # with replicas: the thread that sends, started at the first push

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
        if self.replicas:
            self._sending().hand(batch)
            return
        for start in range(0, len(batch), MAX_PIPELINE):
            chunk = batch[start:start + MAX_PIPELINE]
            _settle(chunk, self._results(chunk))

    def _sending(self) -> _Sender:
        """The sender thread of this process (a forked gunicorn worker starts its own)."""
        if self._sender is None or self._sender.pid != os.getpid():
            self._sender = _Sender(self._results)
        return self._sender

    def _results(self, batch: list[_Push]) -> list[Any]:
        """Each push's answer, or the error it met (on the loop's thread, or the sender's)."""
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
        return results

    def _evalsha(self, push: _Push) -> tuple:
        """EVALSHA itself, not Script.__call__, which asks SCRIPT EXISTS first."""
        return ("EVALSHA", self.script.sha, len(push.keys), *push.keys, *push.args)

    def _run_together(self, batch: list[_Push]) -> list[Any]:
        """One round trip: every push's EVALSHA written at once, their answers read in order."""
        assert self.line is not None
        return self.line.exchange([self._evalsha(push) for push in batch])

    def _run_together_and_wait(self, batch: list[_Push]) -> list[Any]:
        """One round trip as _run_together's, then WAIT on its connection (the sender's own)."""
        assert self.line is not None
        *answers, acknowledged = self.line.exchange([*map(self._evalsha, batch),
                                                     ("WAIT", self.replicas, REPLICA_WAIT_MS)])
        return self._verdict(answers, acknowledged)

    def _run_by_node(self, batch: list[_Push]) -> list[Any]:
        """Redis Cluster: each node's pushes in one round trip on a line to the node (its WAIT
        last, with replicas), node after node. A push to a node that no longer holds its slot is
        answered MOVED and fails (it did not run), as do a dead node's pushes; either way the
        cluster client learns the slot map again for the next round trip."""
        on: dict[redis.Redis, list[int]] = {}  # a node's client -> its pushes' places in the batch
        try:
            for i, push in enumerate(batch):
                on.setdefault(node_client(self.client, push.keys[0]), []).append(i)
        except redis.exceptions.SlotNotCoveredError as uncovered:  # a slot with no node the client knows of
            self._learn_slots()
            raise redis.ConnectionError(str(uncovered)) from None
        results: list[Any] = [None] * len(batch)
        for node, places in on.items():
            commands = [self._evalsha(batch[i]) for i in places]
            wait = [("WAIT", self.replicas, REPLICA_WAIT_MS)] if self.replicas else []
            try:
                answers = self._line_to(node).exchange(commands + wait)
            except redis.RedisError as error:  # this node's pushes fail; the other nodes' keep their answers
                answers = [error] * (len(commands) + len(wait))
            if isinstance(answers[-1], redis.ConnectionError) or any(
                    isinstance(a, redis.exceptions.MovedError) for a in answers):
                self._learn_slots()  # the node is gone, or no longer holds the slot
            if wait:
                *answers, acknowledged = answers
                answers = self._verdict(answers, acknowledged)
            for i, answer in zip(places, answers):
                results[i] = answer
        return results

    def _line_to(self, node: redis.Redis) -> Line:
        if node not in self._node_lines:
            self._node_lines[node] = Line(node, resend=False)
        return self._node_lines[node]

    def _learn_slots(self) -> None:
        """The cluster client learns its slot map again (its own calls do so as they fail), so that
        the next round trip finds each slot's node of now; best effort: a cluster that does not
        answer is asked again at the next failure."""
        nodes = getattr(self.client, "nodes_manager", None)  # None: a lone Redis standing in for one node
        try:
            if nodes is not None:
                nodes.initialize()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as error:
            log.warning("outbox: could not learn the cluster's slots again: %s", error)

    def _verdict(self, answers: list[Any], acknowledged: Any) -> list[Any]:
        """The answers of a round trip whose WAIT answered `acknowledged`: each a push wrote on fewer
        replicas than wanted becomes NotReplicated (its request undoes it, web/pipeline.py)."""
        if not isinstance(acknowledged, Exception) and acknowledged >= self.replicas:
            return answers
        refused = (f"the job was not on {self.replicas} Redis replica(s) within {REPLICA_WAIT_MS} ms, "
                   "so it was not accepted; retry")
        return [NotReplicated(refused) if not isinstance(answer, Exception) and self.wrote(answer) else answer
                for answer in answers]


class _Sender:
    """An outbox's round trips when each ends with a WAIT: on a thread of their own, with its own
    connection (Line holds one per thread), so the event loop never waits on Redis. Each round
    trip takes every push handed over since the last began; the answers go back to the event loop
    of their requests (one outbox serves one loop at a time)."""

    def __init__(self, results: Callable[[list[_Push]], list[Any]]):
        self._results = results
        self._handed: list[_Push] = []
        self._ready = threading.Condition()
        self.pid = os.getpid()
        threading.Thread(target=self._run, name="outbox-sender", daemon=True).start()

    def hand(self, batch: list[_Push]) -> None:
        """Called on the event loop: these pushes go in the next round trip."""
        with self._ready:
            self._handed.extend(batch)
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._handed)
                batch, self._handed = self._handed, []
            for start in range(0, len(batch), MAX_PIPELINE):
                chunk = batch[start:start + MAX_PIPELINE]
                results = self._results(chunk)  # never raises: the thread outlives any round trip
                try:
                    chunk[0].sent.get_loop().call_soon_threadsafe(_settle, chunk, results)
                except RuntimeError:  # their loop has closed (a test's): nobody awaits them
                    pass


def _settle(batch: list[_Push], results: list[Any]) -> None:
    """On the event loop: each push's answer to its request."""
    for push, result in zip(batch, results):
        push.result = result
        if not push.sent.done():  # done: its request was cancelled meanwhile
            push.sent.set_result(None)

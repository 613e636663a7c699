"""A chain's run: each request item through the chain's steps, every step on its own model's queue.

A chain (common/tasks/base.py, `Chain`) is served by a worker like any model: it takes the
chain's jobs, and its loop's run step hands the batch here instead of to a backend. Each item
then goes step by step, on its own:

    next_items   the chain's hook: the step's items for this item (one, or one per element of the
                 step before: a fan-out), run in this worker, where the step before answered
    push         one job per element onto the step model's queue, in the item's lane, with its
                 deadline, trace and request id (common/link/lua/step_push.lua): there it batches
                 with every other request's items
    replies      each element's result or error, through this worker's reply list for that model
                 (a listener thread per step model, as the web tier's inbox)
    answer       once the last step is done, the chain's hook makes the item's result, which the
                 loop's reply step answers as any model's

An element that fails is a StepFailed in its step's results, for the hooks to answer or to raise
(the request fails only if they say so). Nothing here is lost to a kill: the chain's jobs stay in
this worker's in-flight list until answered (a peer recovers them and runs the chain again), and a
step's jobs are any model's (a peer of a killed step worker runs them). An item whose request
passes its deadline, or whose client left (marked gone, as the web tier marks any job), stops
there, and its step jobs still queued are marked gone so that no step worker runs them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from funnel.common.contracts import priority
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Job, Reply, WireError, decode_reply, encode_job, now_ms
from funnel.common.errors import FunnelError, Timeout, reply_status
from funnel.common.link import lua_scripts
from funnel.common.store import load_spec
from funnel.common.tasks.base import Chain, Context, Inputs, StepFailed, split
from funnel.worker.batch import Batch

log = logging.getLogger(__name__)

LISTEN_S = 1.0  # a listener's longest BRPOP: how soon it sees the chain closed
WATCH_S = 0.05  # how often a running batch looks for items past their deadline or whose client left
RETRY_S = 0.2  # a listener's pause after a Redis error


class ClientLeft(FunnelError):
    """The request's client left: its item stops, and is answered to nobody."""

    status, code = 499, "client_gone"


@dataclass(eq=False)
class ItemRun:
    """One request item on its way through the steps."""

    job: Job  # the chain's job that holds it
    index: int  # its place among the batch's items
    item: Inputs
    context: Context | None
    done: list[list[Any]] = field(default_factory=list)  # each finished step's results
    results: list[Any] = field(default_factory=list)  # the running step's, by element
    waiting: dict[str, int] = field(default_factory=dict)  # its step jobs not yet answered: id -> element
    model: str = ""  # the running step's model


class StepLinks:
    """This worker's side of its steps' queues: pushing their jobs, and a reply list per step model."""

    def __init__(self, client: redis.Redis, keys: Keys, *, store: str, worker_id: str):
        self.client, self.keys, self.store = client, keys, store
        self.inbox = f"chain-{worker_id}"
        self.push_script = lua_scripts.register(client, "step_push")
        self.leave_script = lua_scripts.register(client, "leave")
        self.arrived: queue.Queue[Reply] = queue.Queue()
        self.closed = threading.Event()
        self.listeners: dict[str, threading.Thread] = {}

    def version(self, step: str) -> tuple[str, int]:
        """A step's model and version: the one it pins ("name:version"), else the highest in the store."""
        name, _, pinned = step.partition(":")
        return name, load_spec(self.store, name, int(pinned) if pinned else None).version

    def reply_to(self, model: str) -> str:
        if model not in self.listeners:
            thread = threading.Thread(target=self._listen, args=(model,), name=f"chain replies {model}", daemon=True)
            self.listeners[model] = thread
            thread.start()
        return self.keys.reply(model, self.inbox)

    def push(self, model: str, version: int, lane: str, jobs: list[Job]) -> None:
        lanes = [self.keys.queue(model, version, each) for each in priority.LANES]
        self.push_script(keys=lanes, args=[priority.LANES.index(lane or priority.NORMAL) + 1,
                                           *(encode_job(job) for job in jobs)])

    def leave(self, model: str, deadline: int, job_ids: list[str]) -> None:
        """Mark step jobs whose item stopped, so that no worker runs them (common/link/lua/leave.lua)."""
        self.leave_script(keys=[self.keys.gone(model)], args=[now_ms(), deadline, *job_ids])

    def _listen(self, model: str) -> None:
        key = self.keys.reply(model, self.inbox)
        while not self.closed.is_set():
            try:
                got = self.client.brpop([key], timeout=LISTEN_S)
            except redis.RedisError as exc:
                log.warning("chain replies from %s: %s", model, exc)
                self.closed.wait(RETRY_S)
                continue
            if got:
                try:
                    self.arrived.put(decode_reply(got[1]))
                except WireError as exc:
                    log.warning("dropping a reply from %s that does not decode: %s", model, exc)

    def close(self) -> None:
        self.closed.set()


class ChainRunner:
    """What runs a chain's batches (in the loop's run step, as a backend runs a model's)."""

    def __init__(self, task: Chain, client: redis.Redis, keys: Keys, *, store: str, worker_id: str):
        self.task, self.keys, self.client = task, keys, client
        self.links = StepLinks(client, keys, store=store, worker_id=worker_id)
        self.steps = [self.links.version(step) for step in task.steps]  # a missing step fails the load
        self.description = "chain of " + ", ".join(f"{m} version {v}" for m, v in self.steps)

    def run(self, feeds: Any) -> list[dict[str, Any]]:
        raise RuntimeError("a chain runs batches (run_batch), not feeds")

    def close(self) -> None:
        self.links.close()

    def run_batch(self, batch: Batch) -> None:
        """Every runnable item of the batch through the steps; batch.rows gets each one's answer or fault."""
        clock = time.perf_counter()
        runs: list[ItemRun] = []
        for job in batch.runnable:
            for item, context in zip(job.items, job.contexts or [None] * len(job.items)):
                runs.append(ItemRun(job, len(runs), item, context))
        rows: list[Any] = [None] * len(runs)
        waiting: dict[str, ItemRun] = {}  # every step job not yet answered -> its item
        for run in runs:
            self._advance(run, rows, waiting)
        watched = time.monotonic()
        while waiting:
            try:
                reply = self.links.arrived.get(timeout=WATCH_S)
            except queue.Empty:
                reply = None
            if reply is not None and reply.id in waiting:
                run = waiting.pop(reply.id)
                run.results[run.waiting.pop(reply.id)] = _result(reply)
                if not run.waiting:
                    run.done.append(run.results)
                    self._advance(run, rows, waiting)
            if time.monotonic() - watched >= WATCH_S:
                watched = time.monotonic()
                for run, fault in self._stopped({run for run in waiting.values()}):
                    self._stop(run, fault, rows, waiting)
        batch.rows = rows
        batch.run_ms = (time.perf_counter() - clock) * 1000

    def _advance(self, run: ItemRun, rows: list[Any], waiting: dict[str, ItemRun]) -> None:
        """Push the item's next step that has items, or answer it once every step is done."""
        try:
            while len(run.done) < len(self.steps):
                prepared = self.task.next_items(len(run.done), run.item, run.context, run.done)
                if prepared:
                    self._push(run, prepared, waiting)
                    return
                run.done.append([])  # the hook skipped this step
            answer = self.task.answer(run.item, run.context, run.done)
            rows[run.index] = {name: value if isinstance(value, np.ndarray) else _plain(value)
                               for name, value in answer.items()}
        except Exception as exc:  # the hook's own fault, this item's alone
            if not isinstance(exc, FunnelError):
                log.exception("chain %s: a hook failed", self.task.spec.name)
            rows[run.index] = exc

    def _push(self, run: ItemRun, prepared: list, waiting: dict[str, ItemRun]) -> None:
        model, version = self.steps[len(run.done)]
        reply_to, origin = self.links.reply_to(model), run.job
        jobs = []
        for element in prepared:
            inputs, context = split(element)
            jobs.append(Job(id=os.urandom(16).hex(), model=model, items=[inputs], reply_to=reply_to,
                            deadline=origin.deadline, version=version, trace=origin.trace,
                            request_id=origin.request_id, priority=origin.priority,
                            contexts=None if context is None else [context]))
        run.model, run.results = model, [None] * len(jobs)
        run.waiting = {job.id: i for i, job in enumerate(jobs)}
        waiting.update((job.id, run) for job in jobs)
        self.links.push(model, version, origin.priority, jobs)

    def _stopped(self, runs: set[ItemRun]) -> list[tuple[ItemRun, FunnelError]]:
        """The items past their request's deadline, or whose client left (their chain job marked gone)."""
        now = now_ms()
        late: list[tuple[ItemRun, FunnelError]] = [
            (run, Timeout(f"the chain's deadline passed during step {len(run.done) + 1}"))
            for run in runs if run.job.deadline <= now]
        rest = [run for run in runs if run.job.deadline > now]
        if not rest:
            return late
        with self.client.pipeline(transaction=False) as pipe:
            for run in rest:
                pipe.zscore(self.keys.gone(self.task.spec.name), run.job.id)
            marks = pipe.execute()
        return late + [(run, ClientLeft("its client left")) for run, mark in zip(rest, marks) if mark is not None]

    def _stop(self, run: ItemRun, fault: FunnelError, rows: list[Any], waiting: dict[str, ItemRun]) -> None:
        rows[run.index] = fault
        for job_id in run.waiting:
            waiting.pop(job_id, None)
        if run.waiting and run.job.deadline > now_ms():
            self.links.leave(run.model, run.job.deadline, list(run.waiting))
        run.waiting = {}


def _plain(value: Any) -> Any:
    """A value inside an answer as msgpack carries it: the steps' arrays it holds as lists (an answer's
    own outputs may be arrays, which travel as tensors)."""
    if isinstance(value, dict):
        return {key: _plain(each) for key, each in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(each) for each in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _result(reply: Reply) -> Any:
    """An element's result as its model's client gets it, or its failure."""
    if reply.ok:
        return reply.outputs if reply.outputs is not None else (reply.items or [{}])[0]
    error = reply.error or {}
    return StepFailed(str(error.get("message", "")), code=str(error.get("code", "inference_failed")),
                      status=reply_status(error))

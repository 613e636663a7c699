"""The loop's steps for a worker that serves several models: take from one with work, run, reply.

worker/main.py's loop is the same as for one model (take and collate, run,
reply, each on its own thread); what differs is the taking. Each turn the
taker reads every served model's queue lengths in one round trip, then:

- picks, among its resident models with work, the one to take a batch from:
  by lane first, as a batch is filled (high, normal, low, bulk), each lane
  below high owed its floor share of the picks (worker/lanes.py's shares, a
  pick counted as a batch), and within a lane the model whose work has waited
  longest (since this worker saw it queued, or last took from it); that
  model's own take (worker/queue.py) fills the batch by lanes and shares as a
  one-model worker's does, and drops what is past its deadline;
- asks for a cold model with work to be loaded (worker/residency.py), its
  work of the highest lane and longest wait first, when no other live worker
  holds it, or its work has waited here past FUNNEL_COLD_AFTER_MS; room is
  made by evicting a resident model whose queues are empty, and one whose
  work waits only once the cold model's has waited FUNNEL_COLD_AFTER_MS;
- answers the queued jobs of a model that failed to load 503
  (`model_unavailable`, naming why) without running them;
- evicts a resident model version the repository API unloaded
  (common/contracts/repository.py) once none of its work waits: the web tier
  sends it nothing more, and its memory is free for the others.

A chain's batch waits on its steps, which this worker may serve too: it runs
and is answered on a thread of its own (one batch of each chain at a time, as
a chain's own worker runs them), while the loop goes on taking, so the steps'
jobs run here as they would on their own workers, each loaded in turn where
not all fit (a chain takes no room: worker/residency.py). Told to stop, the
worker takes no more of a chain's work, but goes on taking its steps' until
its chains' batches are answered.

Idle, it looks again after IDLE_S at first, doubling to IDLE_MAX_S: a worker of
several models polls, where a one-model worker blocks on its queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from funnel.common.contracts import registry, repository
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply
from funnel.common.store import ModelSpec
from funnel.worker import batch as batching
from funnel.worker.lanes import LOW_FLOOR, NORMAL_FLOOR, Shares
from funnel.worker.linger import Linger
from funnel.worker.queue import JobQueue
from funnel.worker.reply import Replier
from funnel.worker.residency import Loaded, Residency
from funnel.worker.stats import Stats
from funnel.worker.steps import Steps, retrying

log = logging.getLogger("funnel.worker")

IDLE_S = 0.001
IDLE_MAX_S = 0.01
VIEW_S = 1.0  # how long the registry read (who else holds which model) is used before it is read again


@dataclass
class Served:
    """One model version the worker serves: its queues and reply lists, and its steps while loaded."""

    spec: ModelSpec
    member: str  # its worker id in the registry and its in-flight list's
    queue: JobQueue
    replier: Replier
    linger: Linger
    stats: Stats
    steps: Steps | None = None
    since: list[float] = field(default_factory=list)  # per lane: since when its work waits (inf: none)


class Multiplex:
    def __init__(self, client: redis.Redis, keys: Keys, served: list[Served], residency: Residency,
                 make_steps: Callable[[Served, Loaded], Steps], *, cold_after_s: float, bulk_share: float,
                 stop: threading.Event):
        self.client, self.keys, self.residency, self.stop = client, keys, residency, stop
        self.served = served
        self.make_steps, self.cold_after_s = make_steps, cold_after_s
        self.shares = Shares([0.0, NORMAL_FLOOR, LOW_FLOOR, bulk_share])  # per pick, across models
        self.lists = [s.queue.lanes for s in served]  # each model's lanes, in the order served
        for s in served:
            s.since = [float("inf")] * len(s.queue.lanes)
        # id(batch) -> the model it was taken for, and its steps (None: refused, its model failed to load)
        self._owner: dict[int, tuple[Served, Steps | None]] = {}
        self._last: Steps | None = None  # the steps whose batch the taker handed over last
        self._idle_s = IDLE_S
        self._view: tuple[float, list[dict[str, str]]] = (-float("inf"), [])
        self._members = {s.member for s in served}
        self._names = sorted({s.spec.name for s in served})
        self._unloaded: tuple[float, dict[str, frozenset[int]]] = (-float("inf"), {})  # read at, marks
        self._chain_members = {m.member for m in residency.models.values() if m.chain}
        self._chains: set[str] = set()  # the chains whose batch is taken and not yet answered
        self._chains_lock = threading.Lock()

    # -- the loop's three steps ------------------------------------------------------------------

    def take_and_collate(self) -> batching.Batch | None:
        if self._last is not None:
            last, self._last = self._last, None
            if last.pace():
                return None
        now = self._look()
        if now is None:  # stopped while Redis was down
            return None
        retrying(lambda: self._load_cold(now), self.stop)
        retrying(lambda: self._evict_unloaded(now), self.stop)
        for s in self.served:  # an evicted model's steps go too: they hold its backend, and its memory
            if s.steps is not None and self.residency.state(s.member) != "resident":
                s.steps = None
        chosen = self._choose()
        batch = self._take(chosen) if chosen is not None else None
        if chosen is None or batch is None:
            if self.stop.is_set():  # stopping, a chain's steps still to take: look again, unhurried
                time.sleep(self._idle_s)
            else:
                self.stop.wait(self._idle_s)
            self._idle_s = min(IDLE_MAX_S, self._idle_s * 2)
            return None
        self._idle_s = IDLE_S
        self._owner[id(batch)] = (chosen, None if batch.refused else chosen.steps)
        return batch

    def run(self, batch: batching.Batch) -> None:
        if batch.refused:
            return
        served, steps = self._owner[id(batch)]
        assert steps is not None  # not refused: its steps
        if served.member not in self._chain_members:
            steps.run(batch)
            return
        del self._owner[id(batch)]  # answered by its own thread, not the loop's reply step
        threading.Thread(target=self._run_chain, args=(served, steps, batch), daemon=True,
                         name=f"chain {served.spec.name}").start()

    def busy(self) -> bool:
        """Whether a chain's batch is taken and not yet answered: its steps may still need this worker."""
        with self._chains_lock:
            return bool(self._chains)

    def _run_chain(self, served: Served, steps: Steps, batch: batching.Batch) -> None:
        try:
            steps.run(batch)
            steps.reply(batch)
        except Exception:  # as a failed loop ends the worker: its jobs in flight go to a peer
            log.exception("chain %s: a batch failed; stopping", served.spec.name)
            self.stop.set()
        finally:
            self.residency.unpin(served.member)
            with self._chains_lock:
                self._chains.discard(served.member)

    def reply(self, batch: batching.Batch) -> None:
        if id(batch) not in self._owner:  # a chain's, answered by its own thread
            return
        served, steps = self._owner.pop(id(batch))
        if batch.refused:
            if retrying(lambda: served.replier.answer(batch.replies, batch.dead, batch.taken, batch.taken_ids)
                        or True, self.stop, until_done=True):
                served.queue.forget(len(batch.taken))
            served.stats.add(errors=batch.errors, dead=len(batch.dead))
            return
        try:
            steps.reply(batch)  # type: ignore[union-attr]  # not refused: its steps
        finally:
            self.residency.unpin(served.member)

    # -- which model --------------------------------------------------------------------------------

    def _look(self) -> float | None:
        """Read every model's lane lengths and note since when each lane's work waits; the time read
        (None: stopped while Redis was down)."""
        lengths = retrying(self._lengths, self.stop)
        if lengths is None:
            return None
        now = time.monotonic()
        for s, lanes in zip(self.served, lengths):
            s.since = [min(since, now) if n else float("inf") for since, n in zip(s.since, lanes)]
        return now

    def _lengths(self) -> list[list[int]]:
        """Every served model's lane lengths, in one round trip."""
        self.residency.renew()
        pipe = self.client.pipeline(transaction=False)
        for lists in self.lists:
            for key in lists:
                pipe.llen(key)
        found = iter(pipe.execute())
        return [[next(found) for _ in lists] for lists in self.lists]

    def _choose(self) -> Served | None:
        """The resident (or failed) model to take from: by lane, each lane owed its floor share of the
        picks, then the longest waiting. Not a chain whose batch is under way, nor, once stopping, any chain."""
        with self._chains_lock:
            chains = set(self._chains)
        ready = [s for s in self.served if self.residency.state(s.member) in ("resident", "failed")
                 and min(s.since) < float("inf") and s.member not in chains
                 and not (self.stop.is_set() and s.member in self._chain_members)]
        if not ready:
            return None
        lanes = len(self.shares.floors)
        places = self.shares.reserve(1)
        with_work = [lane for lane in range(lanes) if any(s.since[lane] < float("inf") for s in ready)]
        owed = [lane for lane in reversed(with_work) if places[lane]]  # a floor share due, lowest lane first
        lane = owed[0] if owed else with_work[0]
        self.shares.spend([int(i == lane) for i in range(lanes)], 1)
        chosen = min((s for s in ready if s.since[lane] < float("inf")), key=lambda s: s.since[lane])
        chosen.since = [float("inf")] * lanes  # served now: its next turn waits behind the others'
        return chosen

    def _take(self, served: Served) -> batching.Batch | None:
        """A batch of the chosen model: run on its backend, or (it failed to load) refused."""
        if self.residency.state(served.member) == "failed":
            return self._refuse(served)
        loaded = self.residency.pin(served.member)
        if loaded is None:  # evicted since it was chosen
            return None
        if served.steps is None or served.steps.backend is not loaded.backend:
            served.steps = self.make_steps(served, loaded)
        batch = served.steps.take_and_collate(block_s=0)
        if batch is None:
            self.residency.unpin(served.member)
            return None
        if served.member not in self._chain_members:
            self._last = served.steps  # the next take waits for its run's end; a chain's runs aside
        else:
            with self._chains_lock:
                self._chains.add(served.member)  # busy from now: its steps are taken until it is answered
        return batch

    def _refuse(self, served: Served) -> batching.Batch | None:
        """The model's queued jobs, each answered 503 naming why the model could not be loaded."""
        spec = served.spec
        taken = retrying(lambda: served.queue.take(spec.batch_size, served.linger, 0), self.stop)
        if taken is None or not taken.jobs:
            return None
        batch = batching.decode(taken.jobs, spec.name, self.keys, served.member, spec.version)
        batch.refused = True
        error = self.residency.models[served.member].error
        for job in batch.jobs:
            batch.replies.append((job.reply_to, Reply.failure(
                job.id, "model_unavailable", f"{spec.name} version {spec.version} could not be loaded: {error}",
                worker=served.member, version=spec.version)))
        return batch

    # -- which model to load ----------------------------------------------------------------------

    def _load_cold(self, now: float) -> None:
        """Ask for the most pressing cold model with work to be loaded, where it is wanted here."""
        cold = [s for s in self.served if min(s.since) < float("inf") and self.residency.due(s.member)]
        if not cold:
            return
        held = self._held_elsewhere(now)
        busy = frozenset(s.member for s in self.served if min(s.since) < float("inf"))
        for s in sorted(cold, key=lambda s: min((lane, t) for lane, t in enumerate(s.since) if t < float("inf"))):
            patient = now - min(s.since) < self.cold_after_s
            if (s.spec.name, s.spec.version) in held and patient:
                continue
            if self.residency.load(s.member, spare=busy if patient else frozenset()):
                return

    def _evict_unloaded(self, now: float) -> None:
        """Free the memory of a resident model version the repository API unloaded, once none of its work
        waits (common/contracts/repository.py; the marks read at most every VIEW_S)."""
        read_at, unloaded = self._unloaded
        if now - read_at > VIEW_S:
            unloaded = {name: repository.read(self.client, self.keys, name) for name in self._names}
            self._unloaded = (now, unloaded)
        for s in self.served:
            if s.spec.version in unloaded[s.spec.name] and min(s.since) == float("inf"):
                self.residency.evict(s.member, "unloaded through the repository API")

    def _held_elsewhere(self, now: float) -> set[tuple[str, int]]:
        """The model versions another live worker has loaded (the registry, read at most every VIEW_S)."""
        read_at, workers = self._view
        if now - read_at > VIEW_S:
            workers = registry.live_workers(self.client, self.keys)
            self._view = (now, workers)
        return {(w.get("model", ""), registry.version_of(w)) for w in workers
                if w["id"] not in self._members and registry.resident(w)}

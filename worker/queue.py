"""Taking jobs: atomically from its model version's queues into this worker's in-flight list.

Jobs are moved, never popped, so a worker that dies holding them leaves them
in funnel:inflight:{<model>}:<worker id> for recovery instead of losing them.
All the lists carry the model's hash tag, so on Redis Cluster the take's
script stays in one slot.

Four queues per model version, served in order: the three priority lanes of
interactive requests (high, normal, low: common/contracts/priority.py) and the bulk
queue (the items of async and bulk jobs); a worker serves one version and
takes from its queues only. A batch is filled from the lanes in order, but
every lane below high is owed a floor share of its places while it has work
waiting (worker/lanes.py; bulk's is FUNNEL_BULK_SHARE), so a low request and a
bulk job progress under any load above them (one Lua script,
common/link/lua/take.lua); places a lane leaves are the others' again. While
interactive jobs keep coming (one taken within INTERACTIVE_RECENT_S), bulk
items never take more than their share, even of a batch that nothing else
fills: an interactive request then waits behind a small bulk batch, not a full
one. With no interactive traffic, bulk items fill whole batches. An idle
worker blocks on the normal queue (BLMOVE, woken at once by an LPUSH, a job's
first move into its hands): a request that finds every lane empty is pushed
there whatever its lane, and a full batch that leaves high or low jobs behind
an empty normal queue moves one there (common/link/lua/push.lua, take.lua). It
notices new bulk items within block_s (a second).

Several batches may be in the in-flight list at once (one running, the next
taken while it runs, the last being answered): each is forgotten on its own
when its replies are written (worker/reply.py), and the queue counts the
messages it has handed out and not yet seen forgotten (`forget`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import redis

from funnel.common.bulk.jobs import drop_stopped
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.priority import LANES
from funnel.common.contracts.wire import item_count, peek_job
from funnel.common.link import lua_scripts
from funnel.worker.lanes import LOW_FLOOR, NORMAL_FLOOR, Shares
from funnel.worker.linger import Linger

POLL_S = 0.001
INTERACTIVE_RECENT_S = 1.0  # bulk items fill whole batches only when no interactive job came this recently


@dataclass(frozen=True)
class Taken:
    """What one take brought."""

    jobs: list[bytes]  # the messages to run, oldest first (wire bytes)
    left: int = 0  # interactive jobs it dropped unrun, their clients gone (take.lua's `left`)
    wait_s: float = 0.0  # how long the batch waited to fill (the linger)


class JobQueue:
    def __init__(self, client: redis.Redis, keys: Keys, *, model: str, worker_id: str, bulk_share: float = 0.25,
                 version: int = 1):
        self.client, self.keys = client, keys
        self.lanes = keys.taken_from(model, version)
        self.shares = Shares([0.0, NORMAL_FLOOR, LOW_FLOOR, bulk_share])
        self.inflight = keys.inflight(model, worker_id)
        self.gone = keys.gone(model)
        self.dropped = 0  # items of cancelled or expired jobs taken and never run
        self._left = 0  # interactive jobs dropped unrun, their client gone, not yet handed out in a Taken
        self._take_more = lua_scripts.runner(client, "take")  # common/link/lua/take.lua
        # Jobs may sit in our in-flight list from before a restart with the
        # same worker id, from a take cut short by a Redis error, or from one
        # whose answer was lost and that the client's retry ran again.
        self._maybe_leftovers = True
        self._inflight_length = 0  # the in-flight list's length after the last take script
        self._interactive_at = -math.inf  # when this worker last took an interactive job
        self._held = 0  # messages handed out by take() and not yet forgotten
        self._forgotten = threading.Condition()

    def take(self, batch_size: int, linger: Linger, block_s: float) -> Taken:
        """Block up to block_s for the oldest job, then fill the batch up to batch_size items.

        Takes whatever is already queued at once, and waits for more only
        within the linger budget.
        """
        if self._maybe_leftovers:
            # Only the list's unknown messages are leftovers: wait until every batch handed out is answered.
            if not self._all_forgotten(block_s):
                return Taken([])
            leftovers: list[bytes] = self.client.lrange(self.inflight, 0, -1)  # type: ignore[assignment]
            if leftovers:
                jobs = self._handed_out(self._drop_gone(leftovers[::-1]))  # LPUSHed, so oldest last
                self._maybe_leftovers = False
                return Taken(jobs, self._counted_left())
        self._maybe_leftovers = True  # until this take completes
        with self._forgotten:
            held = self._held
        raws, wait_s = self._take(batch_size, linger, block_s)
        jobs = self._handed_out(raws)
        # More in flight than held and taken (answers only shorten the list meanwhile): a take ran
        # whose jobs this worker never saw; the next take collects them once every batch is answered.
        self._maybe_leftovers = self._inflight_length > held + len(raws)
        return Taken(jobs, self._counted_left(), wait_s)

    def _counted_left(self) -> int:
        """The jobs dropped since the last take that returned (a take that raised hands its count on)."""
        left, self._left = self._left, 0
        return left

    def forget(self, count: int) -> None:
        """count messages handed out have left the in-flight list (their batch was answered)."""
        with self._forgotten:
            self._held -= count
            self._forgotten.notify_all()

    def _all_forgotten(self, timeout_s: float) -> bool:
        with self._forgotten:
            return self._forgotten.wait_for(lambda: self._held == 0, timeout=timeout_s)

    def _drop_gone(self, raws: list[bytes]) -> list[bytes]:
        """Leftovers less the jobs whose client has left (marked gone), dropped from the in-flight
        list unrun as the take script drops those it moves."""
        ids = [peek_job(raw).get("id", "") for raw in raws]
        marks = self.client.zmscore(self.gone, ids) if any(ids) else []
        gone = [(raw, job_id) for raw, job_id, mark in zip(raws, ids, marks) if job_id and mark is not None]
        if not gone:
            return raws
        pipe = self.client.pipeline(transaction=False)
        for raw, job_id in gone:
            pipe.lrem(self.inflight, -1, raw)  # type: ignore[arg-type]  # bytes: as taken
            pipe.zrem(self.gone, job_id)
        pipe.execute()
        self._left += len(left_unrun([job_id.encode() for _, job_id in gone]))
        dropped = {raw for raw, _ in gone}
        return [raw for raw in raws if raw not in dropped]

    def _handed_out(self, raws: list[bytes]) -> list[bytes]:
        """Drop the items of cancelled or expired jobs, forgetting them at once (nothing will answer
        them); count the rest as held until forget()."""
        kept, dropped = drop_stopped(self.client, self.keys, raws)
        self.dropped += dropped
        if dropped:
            kept_set = set(kept)
            pipe = self.client.pipeline(transaction=False)
            for raw in raws:
                if raw not in kept_set:
                    pipe.lrem(self.inflight, -1, raw)  # type: ignore[arg-type]  # bytes: as taken
            pipe.execute()
        with self._forgotten:
            self._held += len(kept)
        return kept

    def _fill(self, count: int, places: list[int], caps: list[int], counts: list[int],
              newest: bool = False) -> tuple[list[bytes], list[bytes]]:
        """Jobs of up to count items, each lane kept its places left and held to its cap left; counts,
        the batch's items from each lane so far, grows by what this took. newest: the in-flight list's
        newest job (BLMOVE's) is checked against the gone set first. Also the ids of the jobs dropped
        unrun, their clients gone."""
        args = [count, *(max(0, p - c) for p, c in zip(places, counts)), *(max(0, c - n) for c, n in zip(caps, counts)),
                int(newest)]
        taken, jobs, left, self._inflight_length = self._take_more([self.inflight, self.gone, *self.lanes], args)
        self._left += len(left_unrun(left))
        for i, n in enumerate(taken):
            counts[i] += n
        if any(taken[:-1]):
            self._interactive_at = time.monotonic()
        return jobs, left

    def _take(self, batch_size: int, linger: Linger, block_s: float) -> tuple[list[bytes], float]:
        """The jobs taken, and how long the batch waited to fill."""
        places = self.shares.reserve(batch_size)
        busy = time.monotonic() - self._interactive_at < INTERACTIVE_RECENT_S
        caps = [batch_size] * len(LANES) + [max(1, places[-1]) if busy else batch_size]  # bulk's, last
        counts = [0] * len(self.lanes)
        jobs, _ = self._fill(batch_size, places, caps, counts)  # whatever is queued now
        if not jobs and block_s <= 0:  # a worker of several models looks again itself (worker/multiplex.py)
            return [], 0.0
        if not jobs:
            # BLMOVE takes a fractional timeout (Redis >= 6); redis-py's stub says int.
            first = self.client.blmove(self.lanes[1], self.inflight, block_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
            if first is None:
                return [], 0.0
            self._interactive_at = time.monotonic()
            # Its client may have left while it waited: the next take script checks it, as it checks
            # the jobs it moves itself (and takes whatever came meanwhile).
            counts[1] += item_count(first)  # type: ignore[arg-type]
            more, left = self._fill(max(0, batch_size - sum(counts)), places, caps, counts, newest=True)
            if peek_job(first).get("id", "").encode() in left:
                counts[1] -= item_count(first)  # type: ignore[arg-type]
                jobs = more
            else:
                jobs = [first, *more]  # type: ignore[list-item]  # bytes: the client does not decode
        started = time.monotonic()
        # The take above has just emptied the queues: take again only once the linger has waited
        # (a second script at once cost every batch a round trip, and a lone request its latency).
        while 0 < sum(counts) < batch_size:
            remaining = linger.budget_s(sum(counts), batch_size) - (time.monotonic() - started)
            if remaining <= 0:
                break
            # Poll rather than block: Redis checks blocking timeouts only about
            # every 100 ms (hz 10), far too coarse for a linger of a few ms.
            time.sleep(min(remaining, POLL_S))
            jobs += self._fill(batch_size - sum(counts), places, caps, counts)[0]
        self.shares.spend(counts, batch_size)
        return jobs, time.monotonic() - started


def left_unrun(ids: list[bytes]) -> list[str]:
    """The ids of the jobs a take dropped unrun, their clients gone (take.lua forgot their marks)."""
    return [job_id.decode() for job_id in ids]

"""Taking jobs: atomically from its model version's queues into this worker's in-flight list.

Jobs are moved, never popped, so a worker that dies holding them leaves them
in funnel:inflight:{<model>}:<worker id> for recovery instead of losing them.
All three lists carry the model's hash tag, so on Redis Cluster the take's
script and BLMOVE stay in one slot.

Two queues per model version: funnel:queue:{<model>}:<version> (interactive
requests) and funnel:bulk:{<model>}:<version> (the items of async and bulk
jobs); a worker serves one version and takes from its queues only. A batch is filled
from the interactive queue first, but bulk items waiting get ceil(bulk_share x
batch size) of its places (at least one), so a bulk job progresses under any
interactive load (one Lua script, common/lua/take.lua); places that neither
queue fills are the interactive queue's again. While interactive jobs keep
coming (one taken within INTERACTIVE_RECENT_S), bulk items never take more
than their share, even of a batch that nothing else fills: an interactive
request then waits behind a small bulk batch, not a full one. With no
interactive traffic, bulk items fill whole batches. An idle worker blocks on
the interactive queue only, so it notices new bulk items within block_s (a
second).
"""

from __future__ import annotations

import math
import time

import redis

from funnel.common import lua_scripts
from funnel.common.jobs import drop_stopped
from funnel.common.keys import Keys
from funnel.worker.linger import Linger

POLL_S = 0.001
INTERACTIVE_RECENT_S = 1.0  # bulk items fill whole batches only when no interactive job came this recently


class JobQueue:
    def __init__(self, client: redis.Redis, keys: Keys, model: str, worker_id: str, bulk_share: float = 0.25,
                 version: int = 1):
        self.client, self.keys = client, keys
        self.queue = keys.queue(model, version)
        self.bulk = keys.bulk(model, version)
        self.bulk_share = bulk_share
        self.inflight = keys.inflight(model, worker_id)
        self.dropped = 0  # items of cancelled or expired jobs taken and never run
        self._take_more = lua_scripts.register(client, "take")  # common/lua/take.lua
        # Jobs may sit in our in-flight list from before a restart with the
        # same worker id, or from a take cut short by a Redis error.
        self._maybe_leftovers = True
        self.last_wait_s = 0.0  # how long the last take waited for its batch to fill
        self._interactive_at = -math.inf  # when this worker last took an interactive job

    def take(self, batch_size: int, linger: Linger, block_s: float) -> list[bytes]:
        """Block up to block_s for the oldest job, then fill the batch.

        Takes whatever is already queued at once, and waits for more only
        within the linger budget.
        """
        if self._maybe_leftovers:
            leftovers: list[bytes] = self.client.lrange(self.inflight, 0, -1)  # type: ignore[assignment]
            self._maybe_leftovers = False
            if leftovers:
                return self._runnable(leftovers[::-1])  # LPUSHed, so oldest last
        self._maybe_leftovers = True  # until this take completes
        jobs = self._runnable(self._take(batch_size, linger, block_s))
        self._maybe_leftovers = False
        return jobs

    def _runnable(self, raws: list[bytes]) -> list[bytes]:
        """Drop the items of cancelled or expired jobs; if none is left, forget the take at once
        (otherwise the reply that clears the in-flight list forgets them)."""
        kept, dropped = drop_stopped(self.client, self.keys, raws)
        if dropped:
            self.dropped += dropped
            if not kept:
                self.client.delete(self.inflight)
        return kept

    def _fill(self, count: int, share: int, bulk_cap: int) -> tuple[list[bytes], int]:
        """Up to count jobs (share of them kept for bulk, at most bulk_cap bulk): (jobs, bulk taken)."""
        interactive, jobs = self._take_more(keys=[self.queue, self.inflight, self.bulk],
                                            args=[count, share, bulk_cap])
        if interactive:
            self._interactive_at = time.monotonic()
        return jobs, len(jobs) - interactive

    def _take(self, batch_size: int, linger: Linger, block_s: float) -> list[bytes]:
        share = max(1, math.ceil(self.bulk_share * batch_size)) if self.bulk_share > 0 else 0
        busy = time.monotonic() - self._interactive_at < INTERACTIVE_RECENT_S
        bulk_left = max(share, 1) if busy else batch_size  # bulk places left in this batch
        jobs, bulk = self._fill(batch_size, min(share, batch_size), bulk_left)  # whatever is queued now
        bulk_left -= bulk
        if not jobs:
            # BLMOVE takes a fractional timeout (Redis >= 6); redis-py's stub says int.
            first = self.client.blmove(self.queue, self.inflight, block_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
            if first is None:
                return []
            jobs = [first]  # type: ignore[list-item]  # bytes: the client does not decode
            self._interactive_at = time.monotonic()
        started = time.monotonic()
        while len(jobs) < batch_size:
            more, bulk = self._fill(batch_size - len(jobs), min(share, batch_size - len(jobs)), bulk_left)
            jobs += more
            bulk_left -= bulk
            remaining = linger.budget_s(len(jobs), batch_size) - (time.monotonic() - started)
            if len(jobs) >= batch_size or remaining <= 0:
                break
            # Poll rather than block: Redis checks blocking timeouts only about
            # every 100 ms (hz 10), far too coarse for a linger of a few ms.
            time.sleep(min(remaining, POLL_S))
        self.last_wait_s = time.monotonic() - started
        return jobs

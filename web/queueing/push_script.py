"""The KEYS and ARGV of the web tier's scripts, laid out here once each, as their headers name them:
common/link/lua/push.lua (a request's jobs onto its lane), leave.lua (the jobs of a client that
left, marked for no worker to run) and release.lua (a finished request leaves its key's requests
under way)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from funnel.common.contracts import priority
from funnel.common.contracts.keys import Keys
from funnel.web.queueing.limits import Limit

UNLIMITED = "anyone"  # the owner named in the limit keys of a caller without limits (never read)


@dataclass(frozen=True, kw_only=True)
class PushCall:
    """push.lua's call for one request's jobs: its KEYS and ARGV, each named once here."""

    model: str
    version: int
    lane: str  # the request's priority lane: its jobs go to that queue
    jobs: list[bytes]  # wire bytes
    items: int | None = None  # the request's items (None: one a job)
    per_job: float = 1.0  # the items of a job ahead, on average (the web's estimate)
    max_queue: int = 0  # the queue's limit, items (0: none)
    estimate: Sequence[float | str] | None = None  # Capacity.script_args (None: no predicted wait)
    inflight: Iterable[str] = ()  # the live workers, whose in-flight jobs count as ahead (with an estimate)
    budget_s: float = 0.0  # the request's time left
    owner: str = UNLIMITED  # the API key's owner hash, when it has limits
    limit: Limit | None = None  # its limits (None: none)
    now_ms: int = 0
    token: str = ""  # the request's token among its key's requests under way (its first job's id)
    deadline_ms: int = 0
    cache: CacheLookup | None = None  # each job one cached item (None: not cached)

    def keys(self, keys: Keys) -> list[str]:
        """KEYS: the version's three lanes, the caller's bucket and requests under way, the workers'
        in-flight lists; each cached item's entry and pending marker."""
        fixed = _fixed_keys(keys, self.model, self.version, self.owner, tuple(self.inflight))
        return [*fixed, *self.cache.keys(keys, self.model, self.version)] if self.cache else list(fixed)

    def args(self) -> list:
        """ARGV, in the order of push.lua's header."""
        shed = [1, self.budget_s, *self.estimate] if self.estimate is not None else [0, self.budget_s, 0, 0, 0, 0, 0, 0]
        limited = [1, *self.limit.script_args()] if self.limit is not None else [0, 0, 0, 0]
        cache = self.cache
        jobs = [part for pair in zip(cache.job_ids, self.jobs, strict=True) for part in pair] if cache else self.jobs
        return [self.max_queue, *shed, *limited, self.now_ms, self.token, self.deadline_ms,
                priority.LANES.index(self.lane) + 1, len(self.jobs) if self.items is None else self.items,
                repr(self.per_job), len(tuple(self.inflight)), cache.mode if cache else 0,
                cache.reply_to if cache else "", *jobs]


@functools.lru_cache(maxsize=1024)
def _fixed_keys(keys: Keys, model: str, version: int, owner: str, inflight: tuple[str, ...]) -> tuple[str, ...]:
    """push.lua's KEYS before the cached items': the same for every request of one version, caller
    and set of live workers, so made (and their names checked) once."""
    return (*(keys.queue(model, version, lane) for lane in priority.LANES), keys.limit(model, owner),
            keys.running(model, owner), *(keys.inflight(model, worker) for worker in inflight))


@dataclass(frozen=True, kw_only=True)
class CacheLookup:
    """push.lua's part for a request's cached items, one job each (web/queueing/cache_plan.py)."""

    idents: list[str]  # each job's item's cache ident
    job_ids: list[str]  # each job's id, which its item's pending marker names
    reply_to: str  # the request's reply list, where a job computed for another request answers it too
    read: bool = True  # read the entries (False: they were unreadable: the items are computed again)
    known_only: bool = False  # no live worker: answered only if every item is known, nothing queued

    @property
    def mode(self) -> int:
        return 3 if self.known_only else 1 if self.read else 2

    def keys(self, keys: Keys, model: str, version: int) -> list[str]:
        return [key for ident in self.idents
                for key in (keys.cache(model, version, ident), keys.cache_pending(model, version, ident))]


def leave_call(keys: Keys, model: str, now_ms: int, deadline_ms: int, job_ids: list[str]) -> tuple[list, list]:
    """leave.lua's KEYS (the model's gone set) and ARGV (now, the jobs' deadline, their ids)."""
    return [keys.gone(model)], [now_ms, deadline_ms, *job_ids]


def release_call(keys: Keys, model: str, owner: str, token: str) -> tuple[list, list]:
    """release.lua's KEYS (the key's requests under way on the model) and ARGV (the request's token)."""
    return [keys.running(model, owner)], [token]

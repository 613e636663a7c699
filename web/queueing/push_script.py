"""The push script's KEYS and ARGV, laid out here once, as common/lua/push.lua's header names them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from funnel.common import priority
from funnel.common.keys import Keys
from funnel.web.queueing.limits import Limit

UNLIMITED = "anyone"  # the owner named in the limit keys of a caller without limits (never read)


def keys_of(keys: Keys, model: str, version: int, owner: str, inflight: Iterable[str]) -> list[str]:
    """KEYS: the version's three lanes, the caller's bucket and requests under way, the workers'
    in-flight lists."""
    return [*(keys.queue(model, version, lane) for lane in priority.LANES), keys.limit(model, owner),
            keys.running(model, owner), *(keys.inflight(model, worker) for worker in inflight)]


def args_of(max_queue: int, estimate: Sequence[float | str] | None, budget_s: float, limit: Limit | None,
            now_ms: int, token: str, deadline_ms: int, lane: str, jobs: list[bytes], items: int | None = None,
            per_job: float = 1.0) -> list:
    """ARGV: the queue's limit, the estimate (None: none; else Capacity.script_args), the budget, the
    caller's limit (None: unlimited), now, the request's token and deadline, its lane, its items
    (None: one a job), the items of a job ahead on average, then the jobs."""
    shed = [1, budget_s, *estimate] if estimate is not None else [0, budget_s, 0, 0, 0, 0, 0, 0]
    limited = [1, *limit.script_args()] if limit is not None else [0, 0, 0, 0]
    return [max_queue, *shed, *limited, now_ms, token, deadline_ms, priority.LANES.index(lane) + 1,
            len(jobs) if items is None else items, repr(per_job), *jobs]

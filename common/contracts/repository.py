"""Which versions of a model are unloaded, and whether one still holds work: the repository API's
contract between the web tier and the workers.

A version in the store is served unless it is unloaded. Unloading marks it in
Redis, `funnel:unloaded:{<model>}`, a set of versions (decimal strings) that
every web process reads with the model's traffic policy (web/queueing/versions.py):
from then on no request goes to it, and the jobs already queued for it are
answered by its workers as before. It is drained when its queues and the
in-flight lists of its workers are empty. Loading takes the mark away. This
module is the one home of how the mark is stored and how a drain is measured.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys


def read(client: redis.Redis, keys: Keys, model: str) -> frozenset[int]:
    """The model's unloaded versions (a member that is no version, written by hand, is left out)."""
    members: set[bytes] = client.smembers(keys.unloaded(model))  # type: ignore[assignment]
    return frozenset(int(m) for m in members if m.isdigit() and int(m) >= 1)


def unload(client: redis.Redis, keys: Keys, model: str, versions: Iterable[int]) -> None:
    """Mark these versions unloaded: no new request goes to them."""
    client.sadd(keys.unloaded(model), *map(str, versions))


def load(client: redis.Redis, keys: Keys, model: str, versions: Iterable[int]) -> None:
    """Served again: the mark on these versions taken away (the key goes with its last member)."""
    client.srem(keys.unloaded(model), *map(str, versions))


def holding(client: redis.Redis, keys: Keys, model: str, versions: Iterable[int]) -> int:
    """The jobs these versions still hold: waiting in their queues (every lane and bulk) and taken by their
    workers. A worker that died holding jobs counts them until recovery puts them back on the queue;
    its hash is gone, so every dead worker of the model counts, whatever version it served."""
    wanted = set(versions)
    listed = [w for w, m in registry.registered(client, keys).items() if m == model]
    live = {w["id"]: registry.version_of(w) for w in registry.live_workers(client, keys) if w.get("model") == model}
    holders = [w for w in listed if w not in live or live[w] in wanted]  # theirs, and the dead
    pipe = client.pipeline(transaction=False)
    for key in (key for v in sorted(wanted) for key in keys.taken_from(model, v)):
        pipe.llen(key)
    for worker_id in holders:
        pipe.llen(keys.inflight(model, worker_id))
        pipe.llen(keys.recovering(model, worker_id))
    return sum(pipe.execute())

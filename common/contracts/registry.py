"""The worker registry: what every worker publishes about itself in Redis, and how it is read.

Each worker keeps `funnel:worker:{<model>}:<id>`, a hash with a heartbeat TTL, holding
its description (INFO_FIELDS), its running totals (COUNTERS) and its
batch-size histogram (one `batch_le_<n>` field per bucket), and lists itself
in `funnel:workers` (id -> model) until its jobs are recovered. A worker serves
one version of its model (`version`, absent from the hashes of workers from
before versions: version 1). Workers write
through `publish`; the web tier (/v1/models, /readyz, /metrics), `funnel
inspect` and the workers themselves (device choice, recovery) read through
the functions below, so the field names live here and nowhere else.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.priority import LANES
from funnel.common.link.connection import on_cluster

# Set once at registration; `seen` (epoch seconds of the last heartbeat) is refreshed on every beat.
INFO_FIELDS = ("model", "version", "backend", "device", "batch_size", "linger_ms", "lanes", "wire", "pid", "host",
               "started", "seen")

# A worker serving several models (worker/residency.py) publishes one hash per model, its member id
# (member_id), each with these fields too, refreshed on every beat: the worker's own id, the
# model's state there and, while failed, why. A hash without `state` is a one-model worker's: resident.
MEMBER_FIELDS = ("process", "state", "load_error")
STATES = ("resident", "loading", "cold", "failed")

# Running totals, with the help text /metrics gives them (as funnel_worker_<name>_total).
COUNTERS = {
    "batches": "batches run",
    "items": "jobs answered",
    "errors": "items answered with an error",
    "expired": "jobs dropped past their deadline",
    "left": "jobs dropped unrun because their client had left",
    "dead": "undecodable jobs dead-lettered",
    "recovered": "jobs of dead workers requeued",
    "loads": "times the model was loaded",
    "evictions": "times the model was evicted to make room for another",
    "load_seconds": "time spent loading the model (and warming it up)",
    "infer_seconds": "time spent in the model",
    "wait_seconds": "time spent waiting for batches to fill",
}

# How long the worker's batches take lately, fitted over its recent batches (exponentially
# weighted) as seconds(n) = item_seconds * n + batch_seconds and refreshed on every heartbeat;
# absent until its first batch. The web tier predicts a new job's wait from them (web/queueing/shedding.py).
COST_FIELDS = {
    "item_seconds": "seconds each item of a batch adds",
    "batch_seconds": "fixed seconds of one batch, whatever its size",
}

# Upper bounds of the batch-size histogram's buckets.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_field(bound: int) -> str:
    """The hash field counting batches of size <= bound (and above the previous bound)."""
    return f"batch_le_{bound}"


def member_id(worker_id: str, model: str, version: int) -> str:
    """The id under which a worker serving several models registers one model version: its own id,
    the model and version, or (past the 64 characters of an id) a digest of them in their place."""
    full = f"{worker_id}.{model}.{version}"
    if len(full) <= 64:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    return f"{worker_id[:47]}.{digest}"


def resident(worker: Mapping[str, str]) -> bool:
    """Whether the worker has the model loaded (a one-model worker always has)."""
    return worker.get("state", "resident") == "resident"


def load_error(worker: Mapping[str, str]) -> str:
    """Why the worker could not load the model ("" unless its state is failed)."""
    return worker.get("load_error", "") if worker.get("state") == "failed" else ""


def load_s(worker: Mapping[str, str]) -> float:
    """The worker's mean seconds to load the model (0 before its first load)."""
    loads = counter(worker, "loads")
    return counter(worker, "load_seconds") / loads if loads else 0.0


def publish(client: redis.Redis, keys: Keys, worker_id: str, fields: Mapping[str, Any], ttl_s: float) -> None:
    """List one worker and write its hash (publish_all with one member)."""
    publish_all(client, keys, {worker_id: fields}, ttl_s)


def publish_all(client: redis.Redis, keys: Keys, members: Mapping[str, Mapping[str, Any]], ttl_s: float) -> None:
    """List workers (id -> fields), then write their hashes and refresh their TTLs in one round trip: on
    one Redis one transaction, so a reader (live_workers) sees every member of a process as of one instant
    (a model evicted and the one loaded in its place at once); on a cluster, where the hashes lie in
    different slots, one pipeline a node. Two steps, as the list and the hashes live in different slots on
    a cluster; listed without a hash a worker looks dead until the next beat, and recovery finds nothing
    to move."""
    listing = client.pipeline(transaction=False)  # two keys, two slots on a cluster
    listing.hset(keys.workers(), mapping={worker_id: str(fields["model"]) for worker_id, fields in members.items()})
    listing.set(keys.epoch(), os.urandom(8).hex(), nx=True)  # a Redis that lost its data gets a new one
    listing.execute()
    pipe = client.pipeline(transaction=not on_cluster(client))
    for worker_id, fields in members.items():
        key = keys.worker(str(fields["model"]), worker_id)
        pipe.hset(key, mapping={name: str(value) for name, value in fields.items()})
        pipe.pexpire(key, int(ttl_s * 1000))
    pipe.execute()


def withdraw(client: redis.Redis, keys: Keys, model: str, worker_id: str) -> None:
    """Drop a stopping worker's hash; it stays listed while it holds jobs, for recovery."""
    client.delete(keys.worker(model, worker_id))
    if not client.exists(keys.inflight(model, worker_id)):
        client.hdel(keys.workers(), worker_id)


def registered(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """Every listed worker id -> its model: live ones and dead ones not yet recovered."""
    listed: dict[bytes, bytes] = client.hgetall(keys.workers())  # type: ignore[assignment]
    return {w.decode(): m.decode() for w, m in listed.items()}


def alive(client: redis.Redis, keys: Keys, workers: Mapping[str, str]) -> list[bool]:
    """Whether each worker's (id -> model) heartbeat hash still exists, in one round trip
    (one per node on a cluster: redis-py's cluster pipeline splits single-key commands by node)."""
    pipe = client.pipeline(transaction=False)
    for worker_id, model in workers.items():
        pipe.exists(keys.worker(model, worker_id))
    return [bool(n) for n in pipe.execute()]


def live_workers(client: redis.Redis, keys: Keys) -> list[dict[str, str]]:
    """Every worker whose heartbeat has not expired, as {"id", **its hash fields}, by id; on one Redis
    read in one transaction, so the members of one process show one instant of it (publish_all).

    Raises redis.RedisError when Redis is unreachable: callers answer 503.
    """
    listed = registered(client, keys)
    ids = sorted(listed)
    pipe = client.pipeline(transaction=not on_cluster(client))  # one instant, as publish_all writes them
    for worker_id in ids:
        pipe.hgetall(keys.worker(listed[worker_id], worker_id))
    found = pipe.execute()
    return [{"id": worker_id, **{k.decode(): v.decode() for k, v in info.items()}}
            for worker_id, info in zip(ids, found) if info]


def epoch(client: redis.Redis, keys: Keys) -> str:
    """The registry's epoch (`funnel:epoch`; "" while none is set), which the workers set when it is
    missing (publish): it changes only when Redis loses its data, so a reader that sees it change
    knows live workers may be missing from the registry until their next heartbeat, where with the
    same epoch a worker absent is gone."""
    found = client.get(keys.epoch())
    return found.decode() if isinstance(found, bytes) else ""


def version_of(worker: Mapping[str, str]) -> int:
    """The model version a worker serves, from its hash: 1 when the field is absent (a worker from
    before versions); 0 when it is not a positive integer (a hash written by hand)."""
    try:
        version = int(worker.get("version", 1))
    except ValueError:
        return 0
    return version if version >= 1 else 0


def versions_live(workers: Iterable[Mapping[str, str]], model: str) -> set[int]:
    """The versions of `model` with at least one live worker, from live_workers()."""
    return {v for w in workers if w.get("model") == model and (v := version_of(w))}


def job_format(worker: Mapping[str, str]) -> int:
    """The newest job format a worker reads (common/contracts/wire.py's JOB_FORMAT; `wire`, absent from the
    hashes of workers from before it: 1, one item a job, as every release reads)."""
    found = worker.get("wire", "1")
    return int(found) if found.isdigit() and int(found) >= 1 else 1


def takes_lanes(worker: Mapping[str, str]) -> bool:
    """Whether a worker takes jobs from the priority lanes (`lanes`, absent from the hashes of
    workers from before them: those take the normal queue only)."""
    return worker.get("lanes") == "1"


def counter(worker: Mapping[str, str], name: str) -> float:
    """One of a worker's COUNTERS from its hash (0 before its first heartbeat with it)."""
    return float(worker.get(name, 0))


def batch_cost(worker: Mapping[str, str]) -> tuple[float, float, int] | None:
    """(item_seconds, batch_seconds, batch_size) of a worker, or None before it has timed a batch."""
    try:
        item_s, batch_s = (float(worker[name]) for name in COST_FIELDS)
        size = int(worker["batch_size"])
    except (KeyError, ValueError):
        return None
    if item_s < 0 or batch_s < 0 or item_s + batch_s <= 0 or size < 1:
        return None
    return item_s, batch_s, size


def batch_histogram(worker: Mapping[str, str]) -> list[tuple[int, int]]:
    """(bound, cumulative count of batches of at most that size) for each bucket."""
    cumulative, out = 0, []
    for bound in BATCH_BUCKETS:
        cumulative += int(worker.get(bucket_field(bound), 0))
        out.append((bound, cumulative))
    return out


def version_queue_lengths(client: redis.Redis, keys: Keys, versions: Mapping[str, Iterable[int]],
                          bulk: bool = False) -> dict[str, dict[int, int]]:
    """Jobs waiting in each version's interactive queues, every priority lane (bulk: its bulk queue),
    model -> version -> length, in one round trip."""
    pairs = [(model, version) for model, listed in versions.items() for version in listed]
    queues = [(keys.bulk(model, version),) if bulk else tuple(keys.queue(model, version, lane) for lane in LANES)
              for model, version in pairs]
    pipe = client.pipeline(transaction=False)
    for key in (key for lists in queues for key in lists):
        pipe.llen(key)
    lengths = iter(pipe.execute())
    out: dict[str, dict[int, int]] = {model: {} for model in versions}
    for (model, version), lists in zip(pairs, queues):
        out[model][version] = sum(next(lengths) for _ in lists)
    return out

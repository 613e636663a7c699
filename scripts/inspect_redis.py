"""`funnel inspect`: look inside a running Funnel: models and their versions, queues, in-flight jobs,
dead letters, workers, a job.

    funnel inspect [--redis-url URL] [--prefix funnel]              # summary
    funnel inspect show 'funnel:queue:{text-embedding}:1' [INDEX]   # a job of version 1's queue as JSON
    funnel inspect show 'funnel:dead:{image-classifier}' 0

The summary opens with each model's versions: the live workers of each, its
queue and bulk queue lengths, and its traffic weight (`funnel traffic`).

Index -1 (the default) is the oldest job of a queue: jobs are LPUSHed on the
left and taken from the right. An item of an async or bulk job (on a bulk
queue) is shown with its job's owner: the label of the API key that submitted
it (FUNNEL_API_KEYS; never the key, nor its hash).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis

from funnel.common.contracts import registry, repository, traffic
from funnel.common.contracts.keys import Keys, model_of, version_of
from funnel.common.contracts.wire import WireError, decode_job
from funnel.common.link.connection import connect, scan_keys

QUEUE_KINDS = ("queue-high", "queue", "queue-low", "bulk")  # the lanes (common/contracts/priority.py), then bulk


def job_json(raw: bytes) -> dict:
    """A job as readable JSON: tensors shown as dtype and shape, never their bytes."""
    try:
        job = decode_job(raw)
    except WireError as exc:
        return {"undecodable": str(exc), "bytes": len(raw), "head": raw[:32].hex()}
    now = time.time() * 1000
    return {
        "id": job.id, "model": job.model, "version": job.version, "reply_to": job.reply_to,
        "attempt": job.attempt,
        "age_s": round((now - job.enqueued) / 1000, 3),
        "deadline_in_s": round((job.deadline - now) / 1000, 3),
        "items": [{name: {"dtype": t.dtype.name, "shape": list(t.shape)} for name, t in item.items()}
                  for item in job.items],
    }


def with_owner(client: redis.Redis, keys: Keys, shown: dict) -> dict:
    """A bulk item as job_json shows it, plus its job's owner label ("" where the server has no API
    keys; null when the job has expired)."""
    job_id = keys.job_of_results(shown.get("reply_to") or "")
    if not job_id:
        return shown
    label = client.hget(keys.job(job_id), "owner_label")
    return {**shown, "job": job_id, "job_owner": label.decode() if label is not None else None}


def keys_of(client: redis.Redis, pattern: str) -> list[str]:
    return sorted(k.decode() for k in scan_keys(client, pattern))  # every primary of a cluster


def routing(weights: dict[int, int], live: set[int]) -> str:
    """Where a model's unpinned requests go now (traffic.choose's rule, in words)."""
    weighted = {v: w for v, w in weights.items() if w > 0 and v in live}
    if len(weighted) > 1:
        total = sum(weighted.values())
        return ", ".join(f"version {v} {100 * w / total:.0f}%" for v, w in sorted(weighted.items()))
    chosen = traffic.choose(weights, live)
    return "nothing: no version served (not unloaded) has a live worker" if chosen is None else f"version {chosen}"


def versions_table(client: redis.Redis, keys: Keys, workers: list[dict[str, str]]) -> list[str]:
    """Each model's versions: live workers, queue and bulk lengths, traffic weight (and the policy, and
    the versions unloaded)."""
    versions: dict[str, set[int]] = {}
    for worker in workers:
        if registry.version_of(worker):
            versions.setdefault(worker.get("model", ""), set()).add(registry.version_of(worker))
    for kind in QUEUE_KINDS:
        for key in keys_of(client, keys.pattern(kind)):
            if model_of(key) and version_of(key):
                versions.setdefault(model_of(key), set()).add(version_of(key))
    policies = {}
    for key in keys_of(client, keys.pattern("traffic")):
        if model_of(key):
            policies[model_of(key)] = traffic.read(client, keys, model_of(key))
            versions.setdefault(model_of(key), set()).update(policies[model_of(key)])
    unloaded = {}
    for key in keys_of(client, keys.pattern("unloaded")):
        if model_of(key):
            unloaded[model_of(key)] = repository.read(client, keys, model_of(key))
            versions.setdefault(model_of(key), set()).update(unloaded[model_of(key)])
    versions.pop("", None)
    queued = registry.version_queue_lengths(client, keys, versions)
    bulk = registry.version_queue_lengths(client, keys, versions, bulk=True)
    lines = [f"{'model':<32}{'version':>8}{'live workers':>14}{'queued':>8}{'bulk':>8}{'weight':>8}"]
    for model in sorted(versions):
        weights = policies.get(model, {})
        for version in sorted(versions[model]):
            live = sum(w.get("model") == model and registry.version_of(w) == version for w in workers)
            lines.append(f"{model:<32}{version:>8}{live:>14}{queued[model][version]:>8}{bulk[model][version]:>8}"
                         f"{weights.get(version, '-')!s:>8}")
        policy = f"traffic {traffic.describe(weights)}" if weights else "no traffic policy"
        out = unloaded.get(model, frozenset())
        going = routing(weights, registry.versions_live(workers, model) - out)
        lines.append(f"    {policy}; unpinned requests go to {going}"
                     + (f"; unloaded: {', '.join(map(str, sorted(out)))}" if out else ""))
    return lines


def summary(client: redis.Redis, keys: Keys) -> str:
    workers = registry.live_workers(client, keys)
    lines = [*versions_table(client, keys, workers), ""]
    lines += [f"{'queue':<44}{'jobs':>6}  oldest"]
    for key in [key for kind in QUEUE_KINDS for key in keys_of(client, keys.pattern(kind))]:
        oldest = client.lindex(key, -1)
        age = f"{job_json(oldest).get('age_s', '?')} s" if oldest else "-"
        lines.append(f"{key:<44}{client.llen(key):>6}  {age}")
    lines += ["", f"{'in flight':<44}{'jobs':>6}  worker"]
    for key in keys_of(client, keys.pattern("inflight")):
        worker_id = key.rsplit(":", 1)[1]
        is_live = registry.alive(client, keys, {worker_id: model_of(key)})[0]
        state = "alive" if is_live else "DEAD (awaiting recovery)"
        lines.append(f"{key:<44}{client.llen(key):>6}  {state}")
    lines += ["", f"{'dead letters':<44}{'jobs':>6}"]
    for key in keys_of(client, keys.pattern("dead")):
        lines.append(f"{key:<44}{client.llen(key):>6}")
    lines += ["", "workers (live)"]
    live = {w["id"]: w for w in workers}
    for worker_id in sorted(registry.registered(client, keys)):
        info = live.get(worker_id)
        if info is None:
            lines.append(f"  {worker_id}: heartbeat expired")
            continue
        seen = time.time() - float(info.get("seen", 0))
        totals = " ".join(f"{name} {registry.counter(info, name):g}" for name in ("batches", "items", "errors"))
        lines.append(f"  {worker_id}: {info.get('model')} {info.get('backend')} {info.get('device')} "
                     f"batch {info.get('batch_size')} | version {registry.version_of(info)} | speaks wire "
                     f"{registry.job_format(info)}{', lanes' if registry.takes_lanes(info) else ''} | {totals} "
                     f"| seen {seen:.1f} s ago{held(info)}")
    return "\n".join(lines)


def held(info: dict[str, str]) -> str:
    """A worker of several models' member: its worker, the model's state there, its loads and evictions."""
    if "process" not in info:
        return ""
    error = registry.load_error(info)
    return (f" | of worker {info['process']}: {info.get('state')}{f' ({error})' if error else ''}, loads "
            f"{registry.counter(info, 'loads'):g}, evictions {registry.counter(info, 'evictions'):g}, "
            f"load {registry.load_s(info):.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="funnel inspect", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("FUNNEL_REDIS_URL", "redis://127.0.0.1:6390/0"))
    parser.add_argument("--prefix", default=os.environ.get("FUNNEL_PREFIX", "funnel"))
    parser.add_argument("command", nargs="?", default="summary", choices=["summary", "show"])
    parser.add_argument("key", nargs="?", help="with show: a queue, in-flight or dead-letter list")
    parser.add_argument("index", nargs="?", type=int, default=-1, help="with show: list index (-1: oldest)")
    args = parser.parse_args(argv)
    client = connect(args.redis_url, socket_timeout=10)  # redis://, rediss://, redis+sentinel:// or redis+cluster://
    keys = Keys(args.prefix)
    if args.command == "summary":
        print(summary(client, keys))
        return 0
    if not args.key:
        parser.error("show needs a key, e.g. 'funnel:queue:{text-embedding}:1'")
    raw = client.lindex(args.key, args.index)
    if raw is None:
        hint = ""
        if args.key.endswith("}") and any(args.key.startswith(f"{keys.prefix}:{kind}:") for kind in QUEUE_KINDS):
            hint = f" (each version has its own queue: '{args.key}:1' is version 1's)"
        print(f"{args.key}[{args.index}]: no such job{hint}", file=sys.stderr)
        return 1
    print(json.dumps(with_owner(client, keys, job_json(raw)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

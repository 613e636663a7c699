"""`funnel inspect`: look inside a running Funnel: queues, in-flight jobs, dead letters, workers, a job.

    funnel inspect [--redis-url URL] [--prefix funnel]            # summary
    funnel inspect show 'funnel:queue:{text-embedding}' [INDEX]   # a job as JSON
    funnel inspect show 'funnel:dead:{image-classifier}' 0

Index -1 (the default) is the oldest job of a queue: jobs are LPUSHed on the
left and taken from the right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis

from funnel.common import registry
from funnel.common.connection import connect, scan_keys
from funnel.common.keys import Keys, model_of
from funnel.common.wire import WireError, decode_job


def job_json(raw: bytes) -> dict:
    """A job as readable JSON: tensors shown as dtype and shape, never their bytes."""
    try:
        job = decode_job(raw)
    except WireError as exc:
        return {"undecodable": str(exc), "bytes": len(raw), "head": raw[:32].hex()}
    now = time.time() * 1000
    return {
        "id": job.id, "model": job.model, "reply_to": job.reply_to, "attempt": job.attempt,
        "age_s": round((now - job.enqueued) / 1000, 3),
        "deadline_in_s": round((job.deadline - now) / 1000, 3),
        "inputs": {name: {"dtype": t.dtype.name, "shape": list(t.shape)} for name, t in job.inputs.items()},
    }


def keys_of(client: redis.Redis, pattern: str) -> list[str]:
    return sorted(k.decode() for k in scan_keys(client, pattern))  # every primary of a cluster


def summary(client: redis.Redis, keys: Keys) -> str:
    lines = [f"{'queue':<44}{'jobs':>6}  oldest"]
    for key in keys_of(client, keys.pattern("queue")):
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
    live = {w["id"]: w for w in registry.live_workers(client, keys)}
    for worker_id in sorted(registry.registered(client, keys)):
        info = live.get(worker_id)
        if info is None:
            lines.append(f"  {worker_id}: heartbeat expired")
            continue
        seen = time.time() - float(info.get("seen", 0))
        totals = " ".join(f"{name} {registry.counter(info, name):g}" for name in ("batches", "items", "errors"))
        lines.append(f"  {worker_id}: {info.get('model')} {info.get('backend')} {info.get('device')} "
                     f"batch {info.get('batch_size')} | {totals} | seen {seen:.1f} s ago")
    return "\n".join(lines)


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
        parser.error("show needs a key, e.g. 'funnel:queue:{text-embedding}'")
    raw = client.lindex(args.key, args.index)
    if raw is None:
        print(f"{args.key}[{args.index}]: no such job", file=sys.stderr)
        return 1
    print(json.dumps(job_json(raw), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

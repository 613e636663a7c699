"""GET /dashboard: a live view of the queues, the workers and the requests; GET /dashboard/state: what
it draws.

The page (templates/dashboard.html, static/dashboard.js) asks for the state
every few seconds while it is open and keeps the last minutes of it itself, so
the web tier does nothing for a dashboard nobody watches. The state is what
the registry, the queues and the metrics already hold, read when asked:

- per model version: its queue, bulk queue, in-flight jobs (its live workers'
  lists), traffic weight and live workers (device, backend, batch size, last
  heartbeat, running totals); with its result cache on, this host's running
  totals of its items by outcome (hit, miss, coalesced; null where it is off);
- per model: dead letters, and the running totals of this host's web
  processes' answers by status and their latency histogram: the page turns two
  readings into requests per second, p50 and p99, shed (503) and expired (504);
- the bulk and async jobs not yet finished, with their progress: the caller's
  own, every one for an admin key (or where the server has no API keys).

With API keys set, the state needs one like any API route; the page itself
holds no data and asks for a key when the state answers 401.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from flask import Blueprint, jsonify, render_template

from funnel.common.bulk import jobs
from funnel.common.contracts import registry, traffic
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.priority import LANES
from funnel.common.link.connection import scan_keys
from funnel.web import auth
from funnel.web import metrics as web_metrics
from funnel.web.pipeline import Pipeline
from funnel.web.settings import WebSettings

MAX_JOBS = 20  # the newest unfinished jobs shown
MAX_JOBS_SCANNED = 2000  # job keys looked at per reading: a bound on its cost, whatever Redis holds


def create_blueprint(pipeline: Pipeline, settings: WebSettings) -> Blueprint:
    dashboard = Blueprint("dashboard", __name__)

    @dashboard.get("/dashboard")
    def page():
        return render_template("dashboard.html")

    @dashboard.get("/dashboard/state")
    def state():
        caller = auth.caller(settings)
        try:
            return jsonify(reading(pipeline, caller))
        except redis.RedisError as exc:
            return jsonify({"error": {"code": "unavailable", "message": f"redis: {type(exc).__name__}"}}), 503

    return dashboard


def reading(pipeline: Pipeline, caller: jobs.Caller) -> dict[str, Any]:
    """One reading of everything the dashboard draws, stamped with the time it was taken."""
    client, keys, catalog = pipeline.client, pipeline.keys, pipeline.catalog
    versions = {name: sorted(catalog.versions(name)) for name in catalog.names()}
    workers = registry.live_workers(client, keys)
    pipe = client.pipeline(transaction=False)
    for model, listed in versions.items():
        pipe.llen(keys.dead(model))
        for version in listed:
            for lane in LANES:
                pipe.llen(keys.queue(model, version, lane))
            pipe.llen(keys.bulk(model, version))
    for worker in workers:
        pipe.llen(keys.inflight(worker.get("model", ""), worker["id"]))
    lengths = iter(pipe.execute())
    dead = {}
    queues: dict[tuple[str, int], tuple[dict[str, int], int]] = {}
    for model, listed in versions.items():
        dead[model] = next(lengths)
        for version in listed:
            queues[model, version] = {lane: next(lengths) for lane in LANES}, next(lengths)
    inflight = {worker["id"]: next(lengths) for worker in workers}
    requests = web_metrics.request_totals()
    now = time.time()
    models = []
    for model, listed in versions.items():
        weights = traffic.read(client, keys, model)
        rows = []
        for version in listed:
            mine = [w for w in workers if w.get("model") == model and registry.version_of(w) == version]
            lanes, bulk = queues[model, version]
            cached = catalog.versions(model)[version].cache.on
            answered = requests.get(model, {}).get("cache", {}).get(str(version), {})
            rows.append({"version": version, "queue": sum(lanes.values()), "lanes": lanes, "bulk": bulk,
                         "inflight": sum(inflight[w["id"]] for w in mine), "weight": weights.get(version),
                         "workers": [worker_view(w, now) for w in mine],
                         "cache": answered if cached else None})
        models.append({"name": model, "dead": dead[model], "versions": rows,
                       "requests": {"status": {}, "latency": {}, **requests.get(model, {})}})
    return {"time": now, "models": models, "jobs": unfinished_jobs(client, keys, caller)}


def worker_view(worker: dict[str, str], now: float) -> dict[str, Any]:
    return {"id": worker["id"], "device": worker.get("device", ""), "backend": worker.get("backend", ""),
            "batch_size": int(worker.get("batch_size") or 0), "host": worker.get("host", ""),
            "seen_s": round(max(0.0, now - float(worker.get("seen") or now)), 1),
            "state": worker.get("state", "resident"), "load_error": registry.load_error(worker),
            **{name: int(registry.counter(worker, name))
               for name in ("batches", "items", "expired", "errors", "loads", "evictions")}}


def unfinished_jobs(client: redis.Redis, keys: Keys, caller: jobs.Caller) -> list[dict[str, Any]]:
    """The newest jobs not yet finished that the caller may see, with their progress."""
    found = []
    for i, key in enumerate(scan_keys(client, keys.pattern("job"))):
        if i >= MAX_JOBS_SCANNED:
            break
        job_id = keys.job_of(key.decode())
        if jobs.is_job_id(job_id):  # a record, not a job's results hash
            found.append(job_id)
    pipe = client.pipeline(transaction=False)
    for job_id in found:
        pipe.hgetall(keys.job(job_id))
    records = [jobs.Record.parse(job_id, raw) for job_id, raw in zip(found, pipe.execute()) if raw]
    shown = [r for r in records if r.state in ("queued", "running") and caller.may_see(r)]
    shown.sort(key=lambda r: r.created_ms, reverse=True)
    return [{**r.status(webhook=False), "owner": r.owner_label} for r in shown[:MAX_JOBS]]

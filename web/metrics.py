"""Prometheus metrics: request figures from every gunicorn process, worker figures from Redis.

Request counters live in prometheus_client's multiprocess mode, since each
gunicorn process counts its own requests (PROMETHEUS_MULTIPROC_DIR is set by
web/server.py before any process starts). Worker figures are read from the
workers' registry hashes at scrape time: workers need no port and are found
however they were started.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from funnel.common.contracts import registry, traffic
from funnel.common.contracts.keys import Keys

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("funnel_requests", "HTTP predict and infer requests by model and status", ["model", "status"])
LATENCY = Histogram("funnel_request_seconds", "predict latency, end to end in the web tier",
                    ["model"], buckets=LATENCY_BUCKETS)
QUEUE_WAIT = Histogram("funnel_queue_wait_seconds", "time a job waited before its batch ran",
                       ["model"], buckets=LATENCY_BUCKETS)
UNCLAIMED = Counter("funnel_replies_unclaimed", "replies that reached this tier's inbox with nobody "
                    "waiting: their request had given up (deadline), or the job was answered twice")
JOBS = Counter("funnel_jobs_submitted", "async and bulk jobs created (not replayed) by model and by the "
               "submitting API key's label (FUNNEL_API_KEYS; empty where the server has no keys)",
               ["model", "owner"])
KEYED = Counter("funnel_key_requests", "predict and infer requests by model, API key label (FUNNEL_API_KEYS' "
                "label, or key-<hash> for a bare key; empty where the server has no keys), priority lane served "
                "(or asked, when refused before it was chosen; normal for an X-Priority that names no lane, "
                "refused 400 bad_priority) and status", ["model", "key", "priority", "status"])
CACHE = Counter("funnel_cache_items", "items of cached models by model, version and outcome: hit (answered from "
                "the cache, no worker), miss (computed for the request), coalesced (an identical item under way "
                "for another request, or earlier in the same one, was awaited instead)",
                ["model", "version", "outcome"])
RODE_IN = Histogram("funnel_request_batch_size", "size of the batch each request rode in",
                    ["model"], buckets=registry.BATCH_BUCKETS)


access_log = logging.getLogger("funnel.web.access")


def count(model: str, status: int, seconds: float, content_length: int | None, log: bool) -> None:
    """One answered predict: counted by status, timed, and logged with FUNNEL_ACCESS_LOG."""
    _requests(model, status).inc()
    _per_model(model)[0].observe(seconds)
    if log:
        access_log.info("request model=%s status=%d ms=%.1f bytes=%s", model, status, seconds * 1000,
                        content_length)


def count_key(model: str, key_label: str, lane: str, status: int) -> None:
    """One answered predict, by the key that sent it (its label, never the key) and its lane."""
    _keyed(model, key_label, lane, status).inc()


def replied(model: str, replies) -> None:
    """How long each job queued, and the size (items) of the batch it rode in: one reply a job."""
    _, queue_wait, rode_in = _per_model(model)
    for reply in replies:
        queue_wait.observe(reply.queue_ms / 1000)
        rode_in.observe(reply.batch_size)


def cached(model: str, version: int, outcomes: list[str]) -> None:
    """A cached model's request: each item's outcome, hit, miss or coalesced."""
    for outcome in outcomes:
        _cache(model, version, outcome).inc()


def job_submitted(model: str, owner_label: str) -> None:
    """One job created: counted by model and owner label (never a key)."""
    JOBS.labels(model, owner_label).inc()


# labels() looks its child up under a lock each time: a few microseconds per request, saved.
# Few keys: served model names (or "unknown") and HTTP statuses.
@functools.cache
def _requests(model: str, status: int):
    return REQUESTS.labels(model, str(status))


@functools.cache
def _keyed(model: str, key_label: str, lane: str, status: int):
    return KEYED.labels(model, key_label, lane, str(status))  # bounded: the configured keys' labels


@functools.cache
def _cache(model: str, version: int, outcome: str):
    return CACHE.labels(model, str(version), outcome)  # bounded: served versions, three outcomes


@functools.cache
def _per_model(model: str):
    return LATENCY.labels(model), QUEUE_WAIT.labels(model), RODE_IN.labels(model)


class RedisCollector:
    """Queue lengths, live workers, traffic weights and the workers' totals, read from Redis at each
    scrape, per model version."""

    def __init__(self, client: redis.Redis, keys: Keys, versions: dict[str, list[int]]):
        self.client, self.keys, self.versions = client, keys, versions

    def collect(self):
        try:
            workers = registry.live_workers(self.client, self.keys)
            lengths = registry.version_queue_lengths(self.client, self.keys, self.versions)
            weights = {model: traffic.read(self.client, self.keys, model) for model in self.versions}
        except redis.RedisError:
            return
        queue = GaugeMetricFamily("funnel_queue_length", "jobs waiting in each model version's queue",
                                  labels=["model", "version"])
        live = GaugeMetricFamily("funnel_workers_live", "workers with a live heartbeat", labels=["model", "version"])
        share = GaugeMetricFamily("funnel_traffic_weight", "each version's weight in its model's traffic policy "
                                  "(absent: no policy)", labels=["model", "version"])
        for model, by_version in lengths.items():
            for version, length in by_version.items():
                labels = [model, str(version)]
                queue.add_metric(labels, length)
                live.add_metric(labels, sum(w.get("model") == model and registry.version_of(w) == version
                                            for w in workers))
                if version in weights[model]:
                    share.add_metric(labels, weights[model][version])
        yield queue
        yield live
        yield share
        families = {name: CounterMetricFamily(f"funnel_worker_{name}", help_text,
                                              labels=["model", "version", "worker", "device"])
                    for name, help_text in registry.COUNTERS.items()}
        sizes = HistogramMetricFamily("funnel_worker_batch_size", "batch sizes run by each worker",
                                      labels=["model", "version", "worker", "device"])
        for w in workers:
            labels = [w.get("model", ""), str(registry.version_of(w)), w["id"], w.get("device", "")]
            for name, family in families.items():
                family.add_metric(labels, registry.counter(w, name))
            buckets = [(str(bound), count) for bound, count in registry.batch_histogram(w)]
            buckets.append(("+Inf", buckets[-1][1]))
            sizes.add_metric(labels, buckets, registry.counter(w, "items"))  # sum of sizes = items
        yield from families.values()
        yield sizes


def render(client: redis.Redis, keys: Keys, versions: dict[str, list[int]]) -> bytes:
    collectors = _request_collectors()
    collectors.register(RedisCollector(client, keys, versions))
    return generate_latest(collectors)


def request_totals() -> dict[str, dict[str, dict[str, Any]]]:
    """Running totals of this host's predict requests, per model: "status" (answers by HTTP status),
    "latency" (the latency histogram's cumulative buckets, by upper bound in seconds) and "cache"
    (a cached model's items by version, then outcome: hit, miss, coalesced). Totals, not rates:
    whoever reads them twice (the dashboard) has rates and quantiles over the time between."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for family in _request_collectors().collect():
        for sample in family.samples:
            model = sample.labels.get("model", "")
            if sample.name == "funnel_requests_total":
                totals = _totals(out, model)["status"]
                totals[sample.labels["status"]] = totals.get(sample.labels["status"], 0) + sample.value
            elif sample.name == "funnel_request_seconds_bucket":
                _totals(out, model)["latency"][sample.labels["le"]] = sample.value
            elif sample.name == "funnel_cache_items_total":
                outcomes = _totals(out, model)["cache"].setdefault(sample.labels["version"], {})
                outcomes[sample.labels["outcome"]] = outcomes.get(sample.labels["outcome"], 0) + sample.value
    return out


def _totals(out: dict[str, dict[str, dict[str, Any]]], model: str) -> dict[str, dict[str, Any]]:
    return out.setdefault(model, {"status": {}, "latency": {}, "cache": {}})


def _request_collectors() -> CollectorRegistry:
    """The request figures of every gunicorn process of this host (or of this one process)."""
    collectors = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(collectors)
    else:  # one process (no gunicorn): its own counters are the whole story
        for metric in (REQUESTS, LATENCY, QUEUE_WAIT, RODE_IN, JOBS, CACHE):
            collectors.register(metric)
    return collectors

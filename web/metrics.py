"""Prometheus metrics: request figures from every gunicorn process, worker figures from Redis.

Request counters live in prometheus_client's multiprocess mode, since each
gunicorn process counts its own requests (PROMETHEUS_MULTIPROC_DIR is set by
web/server.py before any process starts). Worker figures are read from the
workers' registry hashes at scrape time: workers need no port and are found
however they were started.
"""

from __future__ import annotations

import os

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from common.keys import Keys
from web.registry import live_workers, queue_lengths

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

REQUESTS = Counter("funnel_requests", "HTTP predict requests by model and status", ["model", "status"])
LATENCY = Histogram("funnel_request_seconds", "predict latency, end to end in the web tier",
                    ["model"], buckets=LATENCY_BUCKETS)
QUEUE_WAIT = Histogram("funnel_queue_wait_seconds", "time a job waited before its batch ran",
                       ["model"], buckets=LATENCY_BUCKETS)
UNCLAIMED = Counter("funnel_replies_unclaimed", "replies that reached this tier's inbox with nobody "
                    "waiting: their request had given up (deadline), or the job was answered twice")
RODE_IN = Histogram("funnel_request_batch_size", "size of the batch each request rode in",
                    ["model"], buckets=BATCH_BUCKETS)


class RedisCollector:
    """Queue lengths and live workers' totals, read from Redis at each scrape."""

    def __init__(self, client: redis.Redis, keys: Keys, models: list[str]):
        self.client, self.keys, self.models = client, keys, models

    def collect(self):
        try:
            workers = live_workers(self.client, self.keys)
            lengths = queue_lengths(self.client, self.keys, self.models)
        except redis.RedisError:
            return
        queue = GaugeMetricFamily("funnel_queue_length", "jobs waiting in each model's queue",
                                  labels=["model"])
        live = GaugeMetricFamily("funnel_workers_live", "workers with a live heartbeat", labels=["model"])
        for model in self.models:
            queue.add_metric([model], lengths[model])
            live.add_metric([model], sum(w.get("model") == model for w in workers))
        yield queue
        yield live
        totals = {
            "batches": "batches run", "items": "jobs answered", "errors": "items answered with an error",
            "expired": "jobs dropped past their deadline", "dead": "undecodable jobs dead-lettered",
            "recovered": "jobs of dead workers requeued", "infer_seconds": "time spent in the model",
            "wait_seconds": "time spent waiting for batches to fill"}
        families = {name: CounterMetricFamily(f"funnel_worker_{name}", help_text,
                                              labels=["model", "worker", "device"])
                    for name, help_text in totals.items()}
        sizes = HistogramMetricFamily("funnel_worker_batch_size", "batch sizes run by each worker",
                                      labels=["model", "worker", "device"])
        for w in workers:
            labels = [w.get("model", ""), w["id"], w.get("device", "")]
            for name, family in families.items():
                family.add_metric(labels, float(w.get(name, 0)))
            cumulative, buckets = 0, []
            for bound in BATCH_BUCKETS:
                cumulative += int(w.get(f"batch_le_{bound}", 0))
                buckets.append((str(bound), cumulative))
            buckets.append(("+Inf", cumulative))
            sizes.add_metric(labels, buckets, float(w.get("items", 0)))  # sum of sizes = items
        yield from families.values()
        yield sizes


def render(client: redis.Redis, keys: Keys, models: list[str]) -> bytes:
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:  # one process (no gunicorn): its own counters are the whole story
        for metric in (REQUESTS, LATENCY, QUEUE_WAIT, RODE_IN):
            registry.register(metric)
    registry.register(RedisCollector(client, keys, models))
    return generate_latest(registry)

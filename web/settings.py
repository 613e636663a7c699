"""The web tier's settings: FUNNEL_* variables, each mirrored by a flag."""

from __future__ import annotations

import os
from dataclasses import dataclass

from funnel.common import settings
from funnel.common.settings import SharedSettings, setting


@dataclass(kw_only=True)
class WebSettings(SharedSettings):
    """The Funnel web tier: validates and preprocesses requests, queues jobs, waits for replies."""

    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port to bind")
    models: list[str] = setting([], "models to serve, comma-separated (default: all in the store)")
    request_timeout_s: float = setting(30.0, "deadline of one request, queueing included")
    max_queue: int = setting(0, "answer 503 when a model's queue holds this many items (0: no limit)")
    shed: bool = setting(True, "answer 503 at once, with Retry-After, when a request's predicted wait "
                         "(queue, in-flight jobs, the workers' recent batch timings) is past its deadline")
    hold_without_workers: bool = setting(False, "queue requests for a model with no live worker until their "
                                         "deadline (scale from zero) instead of answering 503 at once")
    max_body_mb: float = setting(20.0, "largest request body, in MiB")
    max_items: int = setting(64, "most items (texts, inputs) in one request")
    limits: list[str] = setting([], "task limits to override, name=value comma-separated, e.g. "
                                "max_chars=2000,max_pixels=1000000 (GET /v1/models shows each model's)")
    api_keys: list[str] = setting([], "Bearer tokens that may call the API, comma-separated, each `label=KEY` "
                                  "or a bare KEY (default: open); each key is a tenant: its jobs are its own")
    key_limits: str = setting("", "limits per API key label on each model, as JSON or @path to a JSON file: "
                              '{"alice": {"rate": 20, "burst": 40, "concurrency": 8}, "*": {"rate": 5}}; past them '
                              "a 429 with Retry-After")
    admin_keys: list[str] = setting([], "those of the API keys, by label or by key, that may also change how "
                                    "models are served (a model's traffic policy) and read or cancel any job, "
                                    "comma-separated")
    processes: int = setting(0, "gunicorn worker processes (0: one per two cores, at least two; one event "
                             "loop answers thousands of predicts a second, and a CPU-only host's worker needs "
                             "the other cores)")
    threads: int = setting(64, "threads per web process that run Flask's routes (the page, listings, jobs, "
                           "probes); predicts are answered on the process's event loop")
    job_ttl_s: int = setting(86400, "seconds an async or bulk job and its results are kept after its last "
                             "progress (submit, or an item answered); then GET answers 410")
    max_job_items: int = setting(100_000, "most texts (or inputs) in one bulk job")
    job_replicas: int = setting(0, "Redis replicas that must hold a new job before it is accepted: an async or "
                                "bulk job's 202 and a predict's push wait for them (WAIT, up to a second, a push's "
                                "on a thread of its own, never the event loop), else 503 not_replicated and the job "
                                "undone, never run; behind Sentinel or on a Redis Cluster, 1 keeps a failover from "
                                "losing an accepted job (docs/redis.md)")
    max_bulk_queue: int = setting(1_000_000, "answer 503 to a job submit that would make a model's bulk "
                                  "queue longer than this")
    access_log: bool = setting(False, "log one line per predict request (quiet by default under load)")
    max_job_images: int = setting(256, "most images in one bulk job (each holds 150 KB of pixels in the web "
                                  "process while it is queued, and in Redis until it is run)")

    def process_count(self) -> int:
        """FUNNEL_PROCESSES, or one per two of the cores this process may run on, at least two.

        Fewer, busier loops are cheaper per request: a process's Redis round trips and
        wake-ups are shared by the requests waiting on it. But one alone turns a finished
        batch's answers and the requests they bring back around one by one while the worker
        waits for them, and a process that dies leaves nobody answering until gunicorn has
        started another (docs/performance.md).
        """
        return self.processes or max(2, len(os.sched_getaffinity(0)) // 2)

    @classmethod
    def load(cls, argv: list[str] | None = None) -> WebSettings:
        return settings.load(cls, argv, prog="funnel-web")

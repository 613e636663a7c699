"""The worker's settings: FUNNEL_* variables, each mirrored by a flag."""

from __future__ import annotations

import fnmatch
import os
import socket
import uuid
from dataclasses import dataclass

from funnel.common import settings
from funnel.common.contracts.keys import check_name, check_version
from funnel.common.settings import SharedSettings, setting
from funnel.common.store import list_models


def model_and_version(text: str) -> tuple[str, int | None]:
    """--model's NAME or NAME:N as (name, N or None: the highest version in the store)."""
    name, sep, version = text.partition(":")
    check_name(name)
    if not sep:
        return name, None
    if not (version.isascii() and version.isdigit() and version == str(int(version))):
        raise ValueError(f"not a model version: {version!r} (NAME:N, N a positive integer)")
    return name, check_version(int(version))


def default_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:32]
    return f"{host or 'worker'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(kw_only=True)
class WorkerSettings(SharedSettings):
    """A Funnel worker daemon: takes batches of jobs for one model from Redis."""

    model: list[str] = setting([], "model to serve, a folder of the model store: NAME serves its highest version "
                               "in the store at start, NAME:N version N; given again (or comma-separated), "
                               "one worker serves them all, loading each when work waits for it", repeat=True)
    models: str = setting("", "serve every model of the store whose name matches one of these patterns, "
                          "comma-separated (fnmatch: '*' serves them all), each at its highest version, as "
                          "--model given for each")
    max_resident: int = setting(0, "with several models: most of them loaded at once; the least recently "
                                "used is evicted to make room (0: all of them)")
    max_resident_mb: float = setting(0.0, "with several models: most megabytes of model files loaded at once "
                                     "(a GPU's memory budget; 0: no limit)")
    cold_after_ms: float = setting(2000.0, "with several models: load a model another live worker holds once "
                                   "its work has waited this long here")
    load_timeout_s: float = setting(600.0, "with several models: a load still under way after this long is "
                                    "given up, the model failed as one whose load raised (0: no limit)")
    load_retry_s: float = setting(60.0, "with several models: a model that failed to load is answered 503 "
                                  "for this long before it is tried again")
    backend: str = setting("onnx", "inference backend", choices=["onnx", "torch"])
    device: str = setting("cpu", "cpu, cuda:N, or auto: the device with the fewest live workers")
    devices: list[str] = setting([], "candidates for --device auto, comma-separated "
                                     "(default: every CUDA device the backend sees)")
    batch_size: int = setting(0, "most jobs in one batch (0: the model's default)")
    linger_ms: float = setting(5.0, "longest wait for more jobs once one is in hand; the worker waits only "
                               "while the batch holds fewer items than are expected within a run's fixed cost")
    intra_op_threads: str = setting("0", "intra-op threads for the backend: N, or 1/K for a K-th of the cores "
                                    "this worker may run on (K workers sharing them; at least one); 0: the "
                                    "library's default")
    core_lock: str = setting("", "a file every worker on these cores opens (`funnel up` names one where workers "
                             "share a CPU host): a worker on a share of the cores runs a lone item on all of them "
                             "while no other is running (ONNX Runtime on the CPU; worker/cores.py)")
    reply_ttl_s: int = setting(60, "seconds an unread reply is kept")
    bulk_share: float = setting(0.25, "share of each batch's places that items of async and bulk jobs get "
                                "while interactive requests wait too (kept as credit across batches, "
                                "worker/lanes.py; 0: bulk only fills what interactive requests leave)")
    heartbeat_ttl_s: float = setting(10.0, "a worker silent this long is dead and its jobs recovered")
    max_attempts: int = setting(3, "runs of a job (its workers dying) before it is dead-lettered")
    worker_id: str = setting("", "unique id of this worker (default: host-pid-random)")
    spinning: bool = setting(True, "let ONNX Runtime's threads spin-wait between the steps of a run "
                             "(never between runs; off: they sleep, slower unless replicas share the cores)")
    tcmalloc: bool = setting(True, "preload tcmalloc on CPU, when installed, for the torch backend and "
                             "for the process of each model in Python")
    log_batches: bool = setting(False, "log one line per batch (size, wait, inference time)")
    webhook_attempts: int = setting(8, "attempts to deliver a job's webhook before it is marked failed")
    webhook_backoff_s: float = setting(30.0, "wait before the second webhook attempt, doubled for each after "
                                       "(8 attempts: about an hour)")
    webhook_timeout_s: float = setting(5.0, "longest one webhook attempt may take: connect, send, the "
                                       "answer's status line; a claim is held 4 times as long")
    test_hold: str = setting("", "for the fault suite only: STAGE:N:FILE holds the N-th batch at the end of "
                             "STAGE (take, collate, run, reply, stored) and creates FILE (worker/hold.py)")

    @classmethod
    def load(cls, argv: list[str] | None = None) -> WorkerSettings:
        loaded = settings.load(cls, argv, prog="funnel-worker")
        if not loaded.model and not loaded.models:
            raise SystemExit("funnel-worker: --model (or FUNNEL_MODEL) or --models is required")
        for model in loaded.model:
            try:
                model_and_version(model)
            except ValueError as exc:
                raise SystemExit(f"funnel-worker: --model {model!r}: {exc}") from None
        if loaded.max_resident < 0 or loaded.max_resident_mb < 0:
            raise SystemExit("funnel-worker: --max-resident and --max-resident-mb are at least 0")
        try:
            loaded.threads()
        except ValueError as exc:
            raise SystemExit(f"funnel-worker: --intra-op-threads {loaded.intra_op_threads!r}: {exc}") from None
        loaded.worker_id = loaded.worker_id or default_worker_id()
        return loaded

    def served(self) -> list[str]:
        """Every model this worker serves, NAME or NAME:N, as --model and --models name them."""
        patterns = [p.strip() for p in self.models.split(",") if p.strip()]
        matched = [name for name in list_models(self.model_store)
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)]
        named = {model_and_version(m)[0] for m in self.model}
        return [*dict.fromkeys(self.model), *(name for name in matched if name not in named)]

    def threads(self) -> int:
        """The backend's intra-op threads on the cores this worker may run on (0: the library's default)."""
        return thread_count(self.intra_op_threads, len(os.sched_getaffinity(0)))


def thread_count(text: str | int, cores: int) -> int:
    """FUNNEL_INTRA_OP_THREADS's N, or 1/K as a K-th of `cores` (at least one)."""
    text = str(text).strip()
    if text.startswith("1/"):
        share = int(text[2:])
        if share < 1:
            raise ValueError("1/K takes a K of at least 1")
        return max(1, cores // share)
    if not text.isdigit():
        raise ValueError("not a number of threads, nor 1/K")
    return int(text)

"""The worker's settings: FUNNEL_* variables, each mirrored by a flag."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from funnel.common import settings
from funnel.common.contracts.keys import check_name, check_version
from funnel.common.settings import SharedSettings, setting


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


@dataclass
class WorkerSettings(SharedSettings):
    """A Funnel worker daemon: takes batches of jobs for one model from Redis."""

    model: str = setting("", "model to serve, a folder of the model store: NAME serves its highest version "
                         "in the store at start, NAME:N version N")
    backend: str = setting("onnx", "inference backend", choices=["onnx", "torch"])
    device: str = setting("cpu", "cpu, cuda:N, or auto: the device with the fewest live workers")
    devices: list[str] = setting([], "candidates for --device auto, comma-separated "
                                     "(default: every CUDA device the backend sees)")
    batch_size: int = setting(0, "most jobs in one batch (0: the model's default)")
    linger_ms: float = setting(5.0, "longest wait for more jobs once one is in hand; the worker waits only "
                               "while the next job is expected sooner than a batch's fixed cost")
    intra_op_threads: str = setting("0", "intra-op threads for the backend: N, or 1/K for a K-th of the cores "
                                    "this worker may run on (K workers sharing them; at least one); 0: the "
                                    "library's default")
    reply_ttl_s: int = setting(60, "seconds an unread reply is kept")
    bulk_share: float = setting(0.25, "share of each batch's places that items of async and bulk jobs get "
                                "while interactive requests wait too (kept as credit across batches, "
                                "worker/lanes.py; 0: bulk only fills what interactive requests leave)")
    heartbeat_ttl_s: float = setting(10.0, "a worker silent this long is dead and its jobs recovered")
    max_attempts: int = setting(3, "runs of a job (its workers dying) before it is dead-lettered")
    worker_id: str = setting("", "unique id of this worker (default: host-pid-random)")
    spinning: bool = setting(True, "let ONNX Runtime's threads spin-wait between the steps of a run "
                             "(never between runs; off: they sleep, slower unless replicas share the cores)")
    tcmalloc: bool = setting(True, "preload tcmalloc for the torch backend on CPU, when installed")
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
        if not loaded.model:
            raise SystemExit("funnel-worker: --model (or FUNNEL_MODEL) is required")
        try:
            model_and_version(loaded.model)
        except ValueError as exc:
            raise SystemExit(f"funnel-worker: --model {loaded.model!r}: {exc}") from None
        try:
            loaded.threads()
        except ValueError as exc:
            raise SystemExit(f"funnel-worker: --intra-op-threads {loaded.intra_op_threads!r}: {exc}") from None
        loaded.worker_id = loaded.worker_id or default_worker_id()
        return loaded

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

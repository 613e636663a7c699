"""How `funnel up` lays a host's cores out when the user does not: worker processes per model and
each one's model threads (the web tier's processes are its own default, WebSettings.process_count).

On the CPU every process shares the same cores: the web tier's decoding and tokenizing, Redis, and
the model. One worker whose model runs on all the cores has its threads wait for each other
whenever a web process holds one of them (spin-waiting, or woken again), and it runs nothing while
it takes and answers a batch. Two workers, each with its half of the cores and no spin-waiting, keep
one model running while the other takes and answers, and lose no time to a preempted thread
(docs/performance.md, "Where a request's CPU goes"). More than two would split the waiting
requests into smaller batches. A lone request still runs on all the cores: the workers share a
core lock, and one runs a batch of one item on all of them while no other runs (worker/cores.py).
A worker for a GPU keeps one process: the accelerator's time is what it shares.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from funnel.worker.settings import thread_count

WORKERS_ON_CPU = 2  # worker processes per model on a CPU-only host with at least two cores


@dataclass(frozen=True, kw_only=True)
class Layout:
    workers_per_model: int
    threads: int  # each worker's intra-op threads here (0: the library's default, all the cores)
    spinning: bool  # whether the model's threads spin-wait between the steps of a run
    lone_on_all: bool = field(default=True, compare=False)  # the workers share a core lock (worker/cores.py)

    def worker_env(self) -> dict[str, str]:
        """The FUNNEL_* settings that give a worker this layout (none for the settings' defaults): its
        share of the cores as 1/K, which each worker counts where it runs, as a container does."""
        if self.workers_per_model == 1 and not self.threads:
            return {}
        return {"FUNNEL_INTRA_OP_THREADS": f"1/{self.workers_per_model}",
                "FUNNEL_SPINNING": "1" if self.spinning else "0", "FUNNEL_CORE_LOCK": core_lock()}

    def given(self, worker_env: Mapping[str, str], cores: int) -> Layout:
        """This layout as the workers' settings leave it (the user's FUNNEL_INTRA_OP_THREADS,
        FUNNEL_SPINNING and FUNNEL_CORE_LOCK win)."""
        spinning = worker_env.get("FUNNEL_SPINNING", "1" if self.spinning else "0")
        threads = worker_env.get("FUNNEL_INTRA_OP_THREADS")
        return replace(self, threads=self.threads if threads is None else thread_count(threads, cores),
                       spinning=spinning.lower() in ("1", "true", "yes", "on"),
                       lone_on_all=bool(worker_env.get("FUNNEL_CORE_LOCK")))

    def describe(self, cores: int, device: str, web_processes: int) -> str:
        threads = f"{self.threads} model thread{'s' * (self.threads != 1)} each" if self.threads \
            else "the library's model threads"
        spin = "" if self.spinning else ", not spin-waiting"
        lone = ", a lone item on all the cores" if self.threads and self.lone_on_all else ""
        return (f"{cores} core{'s' * (cores != 1)}, models on {device}: {web_processes} web processes, "
                f"{self.workers_per_model} worker{'s' * (self.workers_per_model != 1)} per model "
                f"({threads}{spin}{lone})")


def core_lock() -> str:
    """The core lock of this user's workers on this host (worker/cores.py): every stack of theirs
    shares the same cores."""
    return os.path.join(tempfile.gettempdir(), f"funnel-cores-{os.getuid()}.lock")


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count)."""
    return len(os.sched_getaffinity(0))


def choose(cores: int, device: str, workers_per_model: int | None = None) -> Layout:
    """The layout for a host of `cores` cores whose workers run on `device`; workers_per_model, when
    the user gave it, is kept, and the cores shared among that many."""
    workers = workers_per_model or (WORKERS_ON_CPU if device == "cpu" and cores >= WORKERS_ON_CPU else 1)
    if workers == 1:
        return Layout(workers_per_model=1, threads=0, spinning=True)
    return Layout(workers_per_model=workers, threads=max(1, cores // workers), spinning=False)


def for_environment(environ: Mapping[str, str], workers_per_model: int | None) -> Layout:
    """The layout `funnel up` starts under this environment (FUNNEL_DEVICE, default cpu)."""
    return choose(cores(), environ.get("FUNNEL_DEVICE", "cpu"), workers_per_model)

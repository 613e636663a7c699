"""Warm-up: run each batch shape the worker will use once, before it registers.

The first run of a new input shape pays a one-time setup: on CUDA kernel
plans and algorithm searches (worker/backend.py pads batches to powers of two
so there are few of them), on the CPU the runtime's memory arena and threads.
A worker that registered cold would hand that cost to the first requests
after a scale-up. So before its first heartbeat it runs every power-of-two
batch size up to its batch size with each of the task's warm-up items
(`Task.warmup_inputs`: one per input width worth warming, such as token
lengths for text), smallest first. On the CPU, where shapes cost little, it
stops after CPU_BUDGET_S; on CUDA it runs them all.
"""

from __future__ import annotations

import logging
import time

from funnel.common.tasks import Task
from funnel.worker.backend import Backend

log = logging.getLogger(__name__)

CPU_BUDGET_S = 0.5  # on the CPU only the very first run costs more: a worker registers this soon after loading


def batch_sizes(batch_size: int) -> list[int]:
    """1, 2, 4, ... up to the power of two that batch_size rounds up to (what CUDA pads to)."""
    sizes, n = [], 1
    while True:
        sizes.append(n)
        if n >= batch_size:
            return sizes
        n *= 2


def run(task: Task, backend: Backend, batch_size: int, device: str) -> None:
    items = task.warmup_inputs()
    if not items:
        return
    budget_s = CPU_BUDGET_S if device == "cpu" else float("inf")
    started, runs = time.perf_counter(), 0
    took = [0.0] * len(items)  # each item's last run: a run twice the size is expected to take twice as long
    for size in batch_sizes(batch_size):
        for i, item in enumerate(items):
            if time.perf_counter() - started + 2 * took[i] > budget_s:
                log.info("warm-up stopped after %d runs, within its %g s budget", runs, budget_s)
                return
            clock = time.perf_counter()
            backend.run(task.collate([item] * size))
            took[i] = time.perf_counter() - clock
            runs += 1
    log.info("warmed up: %d batch shapes in %.2f s", runs, time.perf_counter() - started)

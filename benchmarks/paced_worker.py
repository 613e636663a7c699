"""A Funnel worker whose model runs at an accelerator's pace: `python -m benchmarks.paced_worker`.

    PACE_BATCH_MS=2 PACE_ITEM_MS=0.01 python -m benchmarks.paced_worker --model toy-score ...

The worker daemon as it is (`funnel.worker.main`, whichever checkout is on
the path), its backend wrapped so that each run takes PACE_BATCH_MS plus
PACE_ITEM_MS per item from its start to its return, asleep for whatever the
real model (the toy scorer's graph: microseconds) leaves: an accelerator
that costs the host no CPU while it computes, as a GPU does. The wrap is made
where the worker loads its backend, so the same module paces the serial
worker of an older checkout and the pipelined one alike.

The accelerator's time in run, counted by the wrap, and the CPU the real model
took on the run's thread (the toy graph standing in for the accelerator's work:
not the worker's own cost; the benchmark gives the worker one intra-op thread,
so the graph runs on that thread alone): asked with a file
PACE_LEDGER/<pid>.ask, the worker writes "<seconds in run> <runs> <items>
<model CPU seconds>" to PACE_LEDGER/<pid> (a file replaced whole) within
LEDGER_POLL_S, so a benchmark can read it before and after its load. A thread of its own looks for the ask,
where a SIGUSR1 did before: its handler runs on the main thread only, and twice
in 25 runs of two idle workers one of them had not run it 10 s later.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from funnel.worker import backend as backends
from funnel.worker import main as worker

LEDGER_POLL_S = 0.02


class Paced:
    """A backend that answers what `inner` answers, batch_s + item_s x items after each run began."""

    def __init__(self, inner, batch_s: float, item_s: float):
        self.inner, self.batch_s, self.item_s = inner, batch_s, item_s
        self.description = f"{inner.description}, paced {batch_s * 1000:g} ms + {item_s * 1000:g} ms per item"
        self.busy_s, self.runs, self.items, self.model_cpu_s = 0.0, 0, 0, 0.0

    def close(self) -> None:
        self.inner.close()

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[dict]:
        started, cpu = time.perf_counter(), time.thread_time()
        outputs = self.inner.run(feeds)
        self.model_cpu_s += time.thread_time() - cpu
        items = len(next(iter(feeds.values())))
        time.sleep(max(0.0, started + self.batch_s + self.item_s * items - time.perf_counter()))
        self.busy_s += time.perf_counter() - started
        self.runs, self.items = self.runs + 1, self.items + items
        return outputs


def write_ledger(pacers: list[Paced], folder: Path) -> None:
    """The totals of this process's paced backends, in one file replaced whole."""
    totals = (sum(p.busy_s for p in pacers), sum(p.runs for p in pacers), sum(p.items for p in pacers),
              sum(p.model_cpu_s for p in pacers))
    part = folder / f".{os.getpid()}"
    part.write_text(" ".join(map(str, totals)))
    part.replace(folder / str(os.getpid()))


def main() -> int:
    batch_s = float(os.environ.get("PACE_BATCH_MS", "2")) / 1000
    item_s = float(os.environ.get("PACE_ITEM_MS", "0.01")) / 1000
    pacers: list[Paced] = []
    load = backends.load

    def paced(*args, **kwargs) -> Paced:
        pacers.append(Paced(load(*args, **kwargs), batch_s, item_s))
        return pacers[-1]

    backends.load = paced
    if "PACE_LEDGER" in os.environ:
        threading.Thread(target=answer_asks, args=(pacers, Path(os.environ["PACE_LEDGER"])), daemon=True).start()
    return worker.main(sys.argv[1:])


def answer_asks(pacers: list[Paced], folder: Path) -> None:
    ask = folder / f"{os.getpid()}.ask"
    while True:
        time.sleep(LEDGER_POLL_S)
        if ask.exists():
            write_ledger(pacers, folder)
            ask.unlink()


if __name__ == "__main__":
    sys.exit(main())

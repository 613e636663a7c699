"""The cores a host's workers share, and a lone item's loan of all of them.

On a CPU-only host `funnel up` starts two workers a model, each running its model on half the
cores (scripts/layout.py): under load one runs a batch while the other takes and answers. A lone
request would then run on half the cores, slower than one worker on all of them. Workers given the
same core lock (FUNNEL_CORE_LOCK, a file each of them opens) tell each other whether they are
running: a batch of one item runs on all the cores while no other worker is running, and any other
batch on the worker's own share. A batch of several never borrows: under load the other worker is
about to run, and a borrowed core would then serve two runs at once (docs/performance.md).

The lock is flock(2)'s: held shared by every run on a share, exclusive by a borrowing run, and let
go by the kernel when a worker dies. A run on a share waits for a borrowing run to end (one item's
run, milliseconds) rather than share the cores with it, BORROW_WAIT_S at most: a borrower stopped
mid-run (SIGSTOP, a debugger) must not stop the others. Nothing else waits.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

BORROW_WAIT_S = 1.0  # a run on a share waits this long at most for a borrowing run, then runs beside it
POLL_S = 0.0005  # flock(2) has no timeout: a blocked run on a share asks again this often


class CoreLock:
    """One worker's handle on the lock of the cores it shares with others."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def run(self, lone: bool) -> Iterator[bool]:
        """Around one run of the model: whether it may use all the cores (a lone item while no other
        worker on them runs), else it runs on its share, marked as running for the others."""
        alone = lone and self._take(fcntl.LOCK_EX)
        if not alone:
            self._share()
        try:
            yield alone
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _share(self) -> None:
        """Held shared, once no borrowing run holds it, or unmarked after BORROW_WAIT_S."""
        deadline = time.monotonic() + BORROW_WAIT_S
        while not self._take(fcntl.LOCK_SH) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _take(self, mode: int) -> bool:
        try:
            fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self.fd)

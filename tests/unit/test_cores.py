"""The core lock the workers of a host share (worker/cores.py): a lone item borrows all the cores
only while no other worker runs; a run on a share waits for a borrower BORROW_WAIT_S at most."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from funnel.worker.cores import BORROW_WAIT_S, CoreLock


def holder(path: str, lone: bool) -> subprocess.Popen:
    """A worker in another process inside a run (borrowing the cores if it may, when lone) until it is
    killed; it prints 'borrowing' or 'running' once in."""
    return subprocess.Popen([sys.executable, "-c", (
        "import signal; from funnel.worker.cores import CoreLock\n"
        f"with CoreLock({path!r}).run(lone={lone!r}) as alone:\n"
        "    print('borrowing' if alone else 'running', flush=True); signal.pause()\n")],
        stdout=subprocess.PIPE, text=True)


def test_a_lone_item_borrows_the_cores_while_no_other_worker_runs(tmp_path):
    mine, theirs = CoreLock(str(tmp_path / "cores.lock")), CoreLock(str(tmp_path / "cores.lock"))
    with theirs.run(lone=False) as alone:
        assert not alone
        with mine.run(lone=True) as borrowed:  # another worker is running its batch
            assert not borrowed
    with mine.run(lone=True) as alone:  # both let go
        assert alone


def test_a_run_on_a_share_waits_for_a_borrowing_run_to_end(tmp_path):
    """Rather than run beside it on the cores it borrowed: a batch, or another lone item."""
    path = str(tmp_path / "cores.lock")
    mine = CoreLock(path)
    ran: list[str] = []

    def run(lone: bool) -> None:
        with CoreLock(path).run(lone) as alone:
            ran.append(f"lone, borrowed: {alone}" if lone else "batch")

    with mine.run(lone=True) as alone:
        assert alone
        waiting = [threading.Thread(target=run, args=(lone,)) for lone in (False, True)]
        for thread in waiting:
            thread.start()
        for thread in waiting:
            thread.join(timeout=0.2)
        assert all(thread.is_alive() for thread in waiting) and not ran, f"ran beside a borrowing run: {ran}"
        ran.append("borrowing")
    for thread in waiting:
        thread.join(timeout=10)
    assert ran[0] == "borrowing" and sorted(ran[1:]) == ["batch", "lone, borrowed: False"]


def test_a_batch_of_several_never_borrows(tmp_path):
    with CoreLock(str(tmp_path / "cores.lock")).run(lone=False) as alone:
        assert not alone


def test_a_run_that_raises_lets_go(tmp_path):
    mine, theirs = CoreLock(str(tmp_path / "cores.lock")), CoreLock(str(tmp_path / "cores.lock"))
    try:
        with mine.run(lone=True):
            raise RuntimeError("the model failed")
    except RuntimeError:
        pass
    with theirs.run(lone=True) as alone:
        assert alone


def test_a_worker_killed_mid_run_lets_go(tmp_path):
    """A worker SIGKILLed while it runs does not hold the cores: the kernel drops its lock."""
    path = str(tmp_path / "cores.lock")
    other = holder(path, lone=False)
    try:
        assert other.stdout.readline().strip() == "running"
        mine = CoreLock(path)
        with mine.run(lone=True) as alone:
            assert not alone
        other.kill()
        other.wait(timeout=10)
        with mine.run(lone=True) as alone:
            assert alone
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_borrower_stopped_mid_run_delays_the_others_a_bounded_time(tmp_path):
    """A worker paused (SIGSTOP) while it borrows the cores: the others run after BORROW_WAIT_S."""
    path = str(tmp_path / "cores.lock")
    other = holder(path, lone=True)
    try:
        assert other.stdout.readline().strip() == "borrowing"
        started = time.monotonic()
        with CoreLock(path).run(lone=False) as alone:
            waited = time.monotonic() - started
        assert not alone and BORROW_WAIT_S <= waited < BORROW_WAIT_S + 5
    finally:
        other.kill()
        other.wait(timeout=10)

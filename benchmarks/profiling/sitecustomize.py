"""cProfile in every thread of every Funnel process a profile run starts (benchmarks/cpu_profile.py).

`benchmarks/cpu_profile.py` puts this folder on the PYTHONPATH of the stack's processes with
BENCH_PROFILE_DIR naming a folder. Python imports this module at start-up; each Python thread
writes "<native id> <name>" to `<folder>/<pid>.threads` (so /proc's CPU per thread can be named).
With BENCH_PROFILE=1 too, each Python thread also runs under a profiler timed by its own thread's
CPU (time.thread_time), and each process (gunicorn's workers from their fork on) writes a snapshot
of its threads' stats added together, `<folder>/<pid>.<k>.prof`, whenever a file `<folder>/snap-<k>`
appears: the driver takes one before its load and one after, and the difference is the load's
(gunicorn's workers die by their signal, so nothing can wait for their exit). Imports nothing of
Funnel's.
"""

from __future__ import annotations

import cProfile
import marshal
import os
import signal
import sys
import threading
import time

FOLDER = os.environ.get("BENCH_PROFILE_DIR", "")
_profiles: list[cProfile.Profile] = []
START = signal.SIGRTMIN + 3  # a gunicorn worker's main thread starts its profile on it


def _name_thread() -> None:
    with open(os.path.join(FOLDER, f"{os.getpid()}.threads"), "a") as out:
        out.write(f"{threading.get_native_id()} {threading.current_thread().name}\n")


def _start() -> None:
    profile = cProfile.Profile(time.thread_time)
    _profiles.append(profile)
    profile.enable()


def _in_thread(*_args) -> None:  # threading's profile hook: the first event of each new thread
    sys.setprofile(None)
    _name_thread()
    if os.environ.get("BENCH_PROFILE") == "1":
        _start()


def _snapshot() -> dict:
    """The stats of every profile of this process, added; read without stopping them."""
    total: dict = {}
    for profile in list(_profiles):
        profile.snapshot_stats()
        for func, (cc, nc, tt, ct, _callers) in profile.stats.items():  # type: ignore[attr-defined]
            was = total.get(func, (0, 0, 0.0, 0.0, {}))
            total[func] = (was[0] + cc, was[1] + nc, was[2] + tt, was[3] + ct, {})
    return total


def _snapshots(start: bool) -> None:
    """Write a snapshot for each snap-<k> file that appears (a daemon thread, polling)."""
    if start:
        os.kill(os.getpid(), START)
    done: set[str] = set()
    while True:
        for name in os.listdir(FOLDER):
            if name.startswith("snap-") and name not in done:
                done.add(name)
                path = os.path.join(FOLDER, f"{os.getpid()}.{name[5:]}.prof")
                with open(path + ".part", "wb") as out:
                    marshal.dump(_snapshot(), out)
                os.replace(path + ".part", path)
        time.sleep(0.2)


def _watch(start: bool = False) -> None:
    threading.Thread(target=_snapshots, args=(start,), name="profile-snapshots", daemon=True).start()


def _after_fork() -> None:
    """A gunicorn worker: its main thread's profile starts in a signal's handler (one cannot be
    installed from inside fork's hook, and the master's does not go on in the child)."""
    _profiles.clear()
    _name_thread()
    signal.signal(START, lambda *_: _start())  # sent once, by the snapshots' thread
    _watch(start=True)


if FOLDER:
    threading.setprofile(_in_thread)
    _name_thread()
    if os.environ.get("BENCH_PROFILE") == "1":
        _start()
        os.register_at_fork(after_in_child=_after_fork)
        _watch()

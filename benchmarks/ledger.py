"""The job ledger the failover and chaos scenarios keep, read back: what the web and worker processes did.

The processes record it themselves (benchmarks/failover_ledger/sitecustomize.py,
on their PYTHONPATH through `environment`): one file per process and kind,
one line per job id, `<id> <epoch seconds>` (a ledger from before the times
has the id alone). `read` sums them up.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import ROOT

LEDGER_PATH = ROOT / "benchmarks" / "failover_ledger"


def environment(folder: Path) -> dict[str, str]:
    """The variables a web or worker process needs to keep the ledger in `folder`."""
    path = os.pathsep.join(p for p in (str(LEDGER_PATH), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FAILOVER_LEDGER": str(folder)}


@dataclass
class Ledger:
    queued: dict[str, float] = field(default_factory=dict)   # job id -> when Redis acknowledged its push
    answered: collections.Counter = field(default_factory=collections.Counter)  # job id -> answers acknowledged
    answered_at: dict[str, list[float]] = field(default_factory=dict)
    answered_by: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # job id -> (pid, when)
    answering: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # job id -> (pid, when) about to
    expired: dict[str, float] = field(default_factory=dict)  # taken past its deadline, dropped unrun
    left: dict[str, float] = field(default_factory=dict)  # taken after its client left, dropped unrun

    @property
    def lost(self) -> set[str]:
        """Jobs Redis acknowledged that no worker answered, nor dropped as expired or left."""
        return set(self.queued) - set(self.answered) - set(self.expired) - set(self.left)

    def unrecorded(self, killed: dict[int, float], within_s: float = 1.0) -> set[str]:
        """Jobs lost by the ledger alone: a worker was about to answer them and was killed (pid ->
        when) within within_s, before it could record the answer that Redis may have acknowledged;
        had the answer not gone, its jobs would have stayed in its in-flight list and been answered
        by the peer that recovered them."""
        return {job_id for job_id in self.lost
                if any(pid in killed and 0 <= killed[pid] - at <= within_s
                       for pid, at in self.answering.get(job_id, []))}

    @property
    def answered_twice(self) -> list[str]:
        return [job_id for job_id, n in self.answered.items() if n > 1]


def read(folder: Path) -> Ledger:
    ledger = Ledger()
    for path in sorted(folder.iterdir()):
        kind, _, pid = path.name.partition("-")
        for line in path.read_text().splitlines():
            job_id, _, stamp = line.partition(" ")
            if not job_id:
                continue
            at = float(stamp) if stamp else 0.0
            if kind == "queued":
                ledger.queued[job_id] = at
            elif kind == "answering":
                ledger.answering.setdefault(job_id, []).append((int(pid) if pid.isdigit() else 0, at))
            elif kind == "answered":
                ledger.answered[job_id] += 1
                ledger.answered_at.setdefault(job_id, []).append(at)
                ledger.answered_by.setdefault(job_id, []).append((int(pid) if pid.isdigit() else 0, at))
            elif kind == "expired":
                ledger.expired.setdefault(job_id, at)
            elif kind == "left":
                ledger.left.setdefault(job_id, at)
    return ledger

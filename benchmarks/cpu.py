"""CPU accounting from /proc: CPU seconds of process trees, and of the whole machine."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime+cutime+cstime in ticks) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def process_table() -> dict[int, tuple[int, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat:
                table[int(entry)] = stat
    return table


def tree(table: dict, roots: list[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def cpu_ticks(groups: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    """Per group, per process: CPU ticks so far. A process is in the first group whose tree holds it
    (so list the model before the web when the model is a child of the web's process tree)."""
    table = process_table()
    taken: set[int] = set()
    out = {}
    for name, roots in groups.items():
        pids = tree(table, roots) - taken
        taken |= pids
        out[name] = {pid: table[pid][1] for pid in pids}
    return out


def cpu_seconds(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per group between two cpu_ticks(); processes born in between count whole."""
    return {name: sum(ticks - before.get(name, {}).get(pid, 0) for pid, ticks in procs.items()) / CLK_TCK
            for name, procs in after.items()}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLK_TCK

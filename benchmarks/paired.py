"""Funnel against the in-process ceiling measured beside it in time: a ratio a drifting machine cannot move.

    python -m benchmarks.paired [--system funnel-python|funnel] [--pairs 6] [--clients 32] [--duration 8]
                                [--funnel-env FUNNEL_X=VALUE ...] [--against REVISION]

`benchmarks.bench` measures each system in turn, round after round, and divides
medians: on a machine whose speed moves within a run (the eager ceiling measured
274 to 473 items/s in one, docs/performance.md) the ratio moves with it. Here one
stack stays up (as bench starts it, default settings, the text model) and each
pair is the ceiling at batch 32 (benchmarks/peers/ceiling.py, the library's
default threads, the stack idle) and wrk at --clients on the stack, back to
back, their order alternating from pair to pair. Each pair's ratio is the
stack's req/s over the ceiling's items/s of the same pair; the report gives
every pair's and their median. `--funnel-env` starts the stack with a setting
to compare (one run with it, one without).

`--against REVISION` compares code: a second stack runs that git revision of
Funnel (exported as benchmarks.web_cpu's COMMIT is, the same settings), and each
round is the ceiling and both stacks back to back, in an order that rotates
from round to round; the report adds each round's ratio of this tree's stack
to the revision's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks import ROOT, save
from benchmarks.core import machine
from benchmarks.load import write_lua
from benchmarks.measure import measure_point
from benchmarks.payloads import TEXT, payload
from benchmarks.systems import STARTERS, peer, peer_env, wait_ready
from benchmarks.web_cpu import code

IMPL = {"funnel-python": "eager", "funnel": "onnx"}  # the ceiling of the same model implementation


def ceiling(impl: str, options, raw: Path, seconds: float) -> float:
    """Items/s of the model in process at batch 32, the library's default threads."""
    env = peer_env(TEXT, impl, options, {"BENCH_CEILING_ONLY": "batch32"})
    done = subprocess.run(peer("ceiling", f"{seconds:g}", str(raw)), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    return float(json.loads(done.stdout.split("CEILING ", 1)[1])["batch32"])


def start_at(path: str | None, start):
    """start(), its processes importing Funnel from path first (None: this tree)."""
    before = os.environ.get("PYTHONPATH")
    if path:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (path, before) if p)
    try:
        return start()
    finally:
        if path and before is None:
            del os.environ["PYTHONPATH"]
        elif path:
            os.environ["PYTHONPATH"] = before


def orders(stacks: int, i: int) -> list[str]:
    """Round i's order of the ceiling and the stacks: rotated one place each round, reversed every
    other round, so no run always follows the same one."""
    steps = ["ceiling", *(f"stack{k}" for k in range(stacks))]
    turned = steps[i % len(steps):] + steps[:i % len(steps)]
    return turned[::-1] if (i // len(steps)) % 2 else turned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", default="funnel-python", choices=sorted(IMPL))
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of each ceiling run and wrk run")
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before each wrk run")
    parser.add_argument("--store", default=str(ROOT / "model_store"))
    parser.add_argument("--funnel-env", action="append", default=[], metavar="FUNNEL_X=VALUE",
                        help="a setting for the stack (repeatable; each tier reads its own)")
    parser.add_argument("--against", metavar="REVISION",
                        help="a git revision whose Funnel runs in a second stack beside this tree's")
    args = parser.parse_args(argv)
    if any(not re.fullmatch(r"FUNNEL_[A-Z_]+=.*", kv) for kv in args.funnel_env):
        parser.error("--funnel-env takes FUNNEL_NAME=value")
    funnel_env = dict(kv.split("=", 1) for kv in args.funnel_env)
    if args.against:  # its hash names it in the report: HEAD or a branch moves on
        named = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, capture_output=True,
                               text=True)
        if named.returncode != 0:
            parser.error(f"--against: no revision {args.against!r} here")
        args.against = named.stdout.strip()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    impl = IMPL[args.system]
    options = SimpleNamespace(store=str(Path(args.store).resolve()), device="cpu", web_processes=None,
                              funnel_env=funnel_env, duration=args.duration, settle=args.settle)
    data = payload(TEXT, args.system, b"")
    workdir = Path(tempfile.mkdtemp(prefix="funnel-paired-"))
    raw = workdir / "ceiling.raw"
    raw.write_bytes(data.body)
    rounds: list[dict[str, float]] = []  # ceiling items/s, each stack's req/s
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        paths = [None] + ([code(workdir / "revision", args.against)] if args.against else [])
        stacks = []
        for k, path in enumerate(paths):
            folder = workdir / f"stack{k}"
            folder.mkdir()
            running = start_at(path, functools.partial(STARTERS[args.system], TEXT, impl, options, folder))
            cleanup.callback(running.stop)
            wait_ready(running, TEXT, data)
            stacks.append((running, write_lua(folder, args.system, data)))
        log = cleanup.enter_context(open(workdir / "wrk.log", "a"))
        for running, script in stacks:
            measure_point(running, args.system, TEXT, args.clients, script, options, log)  # warm-up
        for i in range(args.pairs):
            found: dict[str, float] = {}
            for step in orders(len(stacks), i):
                if step == "ceiling":
                    found[step] = ceiling(impl, options, raw, args.duration)
                else:
                    running, script = stacks[int(step[5:])]
                    found[step] = measure_point(running, args.system, TEXT, args.clients, script, options,
                                                log)["rps"]
            rounds.append(found)
            print(f"pair {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()), flush=True)
    command = " ".join(["python -m benchmarks.paired", *(argv if argv is not None else sys.argv[1:])])
    save(f"paired-{args.system}", report(args, impl, command, rounds))
    return 0


def report(args, impl: str, command: str, rounds: list[dict[str, float]]) -> str:
    """The pairs' table and the medians of its ratios, as markdown."""
    rev = args.against
    rates = [("stack0", "stack req/s")] + ([("stack1", f"{rev} req/s")] if rev else [])
    ratios = [("stack / ceiling", "the stack against the ceiling", "stack0", "ceiling", 2)]
    if rev:
        ratios += [(f"{rev} / ceiling", f"{rev} against the ceiling", "stack1", "ceiling", 2),
                   (f"stack / {rev}", f"the stack against {rev}", "stack0", "stack1", 3)]
    head = ["pair", "ceiling items/s (batch 32)", *(name for _, name in rates), *(r[0] for r in ratios)]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, found in enumerate(rounds):
        cells = [f"{i + 1}", f"{found['ceiling']:.1f}", *(f"{found[key]:.1f}" for key, _ in rates),
                 *(f"{found[top] / found[bottom]:.{digits}f}" for _, _, top, bottom, digits in ratios)]
        table.append("| " + " | ".join(cells) + " |")
    medians = []
    for _, label, top, bottom, digits in ratios:
        values = [found[top] / found[bottom] for found in rounds]
        medians.append(f"Median of the pairs' ratios, {label}: {statistics.median(values):.{digits}f} "
                       f"(from {min(values):.2f} to {max(values):.2f}).")
    settings = f", with {', '.join(args.funnel_env)}" if args.funnel_env else ""
    versus = f" Beside it, a second stack runs {revision_name(rev)}, the same settings." if rev else ""
    return (f"# {args.system} against the {impl} ceiling beside it, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
            f"Machine: {machine()}\n\nCommand: `{command}`: {args.clients} clients, {args.duration:g} s a run, "
            f"{os.cpu_count()} cores; the stack as `benchmarks.bench` starts it{settings}, this tree at "
            f"{revision_name('HEAD', this_tree=True)}.{versus}\n\n" + "\n".join(table) + "\n\n"
            + "\n".join(medians) + "\n")


def revision_name(rev: str, this_tree: bool = False) -> str:
    """rev's short hash and subject; for this tree, also whether it has changes not committed."""
    line = subprocess.run(["git", "log", "-1", "--format=%h %s", rev], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = this_tree and subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return f"{line}{' with changes not committed' if dirty else ''}"


if __name__ == "__main__":
    sys.exit(main())

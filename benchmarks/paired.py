"""Funnel against the in-process ceiling measured beside it in time: a ratio a drifting machine cannot move.

    python -m benchmarks.paired [--system funnel-python|funnel] [--pairs 6] [--clients 32] [--duration 8]
                                [--funnel-env FUNNEL_X=VALUE ...]

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
"""

from __future__ import annotations

import argparse
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

IMPL = {"funnel-python": "eager", "funnel": "onnx"}  # the ceiling of the same model implementation


def ceiling(impl: str, options, raw: Path, seconds: float) -> float:
    """Items/s of the model in process at batch 32, the library's default threads."""
    env = peer_env(TEXT, impl, options, {"BENCH_CEILING_ONLY": "batch32"})
    done = subprocess.run(peer("ceiling", f"{seconds:g}", str(raw)), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    return float(json.loads(done.stdout.split("CEILING ", 1)[1])["batch32"])


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
    args = parser.parse_args(argv)
    if any(not re.fullmatch(r"FUNNEL_[A-Z_]+=.*", kv) for kv in args.funnel_env):
        parser.error("--funnel-env takes FUNNEL_NAME=value")
    funnel_env = dict(kv.split("=", 1) for kv in args.funnel_env)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    impl = IMPL[args.system]
    options = SimpleNamespace(store=str(Path(args.store).resolve()), device="cpu", web_processes=None,
                              funnel_env=funnel_env, duration=args.duration, settle=args.settle)
    data = payload(TEXT, args.system, b"")
    workdir = Path(tempfile.mkdtemp(prefix="funnel-paired-"))
    raw = workdir / "ceiling.raw"
    raw.write_bytes(data.body)
    pairs: list[tuple[float, float]] = []  # (ceiling items/s, stack req/s)
    running = STARTERS[args.system](TEXT, impl, options, workdir)
    try:
        wait_ready(running, TEXT, data)
        script = write_lua(workdir, args.system, data)
        with open(workdir / "wrk.log", "a") as log:
            measure_point(running, args.system, TEXT, args.clients, script, options, log)  # warm-up
            for i in range(args.pairs):
                found: dict[str, float] = {}
                for step in (("ceiling", "stack") if i % 2 == 0 else ("stack", "ceiling")):
                    if step == "ceiling":
                        found[step] = ceiling(impl, options, raw, args.duration)
                    else:
                        found[step] = measure_point(running, args.system, TEXT, args.clients, script, options,
                                                    log)["rps"]
                pairs.append((found["ceiling"], found["stack"]))
                print(f"pair {i + 1}: ceiling {found['ceiling']:.1f} items/s, {args.system} {found['stack']:.1f} "
                      f"req/s: {found['stack'] / found['ceiling']:.2f}", flush=True)
    finally:
        running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = [stack / top for top, stack in pairs]
    table = ["| pair | ceiling items/s (batch 32) | stack req/s | ratio |", "|---|---|---|---|"]
    table += [f"| {i + 1} | {top:.1f} | {stack:.1f} | {stack / top:.2f} |" for i, (top, stack) in enumerate(pairs)]
    command = " ".join(["python -m benchmarks.paired", *(argv if argv is not None else sys.argv[1:])])
    save(f"paired-{args.system}", f"# {args.system} against the {impl} ceiling beside it, "
                                  f"{time.strftime('%Y-%m-%d %H:%M')}\n\nMachine: {machine()}\n\n"
                                  f"Command: `{command}`: {args.clients} clients, {args.duration:g} s a run, "
                                  f"{os.cpu_count()} cores; the stack as `benchmarks.bench` starts it"
                                  f"{', with ' + ', '.join(args.funnel_env) if funnel_env else ''}.\n\n"
                                  + "\n".join(table) + f"\n\nMedian of the pairs' ratios: "
                                  f"{statistics.median(ratios):.2f} (from {min(ratios):.2f} to {max(ratios):.2f}).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One client's latency, systems side by side: all started at once, measured in turns.

    python -m benchmarks.single_client [--models text-embedding,image-classifier] [--systems flask,funnel,funnel-one]
                                       [--turns 10] [--seconds 3]

A single client leaves a 2-core machine mostly idle, so what a shared machine's other work does to a
run moves one system's p50 more than the systems differ. Here every system (benchmarks/systems.py:
plain Flask, Funnel's default layout, Funnel with one worker on all the cores) is started once and
stays up, idle between its turns, and wrk with one connection drives each in turn for --seconds,
the order rotating, --turns times: each turn's p50 is set against plain Flask's in the same turn.
Prints per system the median p50 over the turns, [min-max], and the median of its per-turn ratio to
plain Flask's; saves the table under benchmarks/results/single-client-<date>.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from benchmarks import ROOT, save
from benchmarks.core import machine
from benchmarks.load import write_lua, wrk
from benchmarks.payloads import MODELS, cat_jpeg, payload
from benchmarks.systems import LABELS, STARTERS, wait_ready


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.single_client", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--systems", default="flask,funnel,funnel-one")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    options = SimpleNamespace(store=str(ROOT / "model_store"), device="cpu", web_processes=None, funnel_env={})
    workdir = Path(tempfile.mkdtemp(prefix="funnel-single-"))
    log = open(workdir / "wrk.log", "w")
    lines = [f"# One client's latency, systems side by side, {dt.datetime.now():%Y-%m-%d %H:%M}", "", machine(), "",
             f"Command: `python -m benchmarks.single_client {' '.join(argv if argv is not None else sys.argv[1:])}` "
             f"(every system up at once, wrk -t1 -c1 for {args.seconds:g} s each in turn, the order rotating, "
             f"{args.turns} turns; the ratio is each turn's p50 over plain Flask's in the same turn)", ""]
    for model in args.models.split(","):
        jpeg = cat_jpeg()
        running = {}
        try:
            for system in systems:
                running[system] = STARTERS[system](model, "onnx", options, workdir)
                wait_ready(running[system], model, payload(model, system, jpeg))
            scripts = {s: write_lua(workdir, f"{s}-{model}", payload(model, s, jpeg)) for s in systems}
            for system in systems:  # warm each
                wrk(running[system].url, scripts[system], 1, args.seconds, log)
            p50: dict[str, list[float]] = {s: [] for s in systems}
            for turn in range(args.turns):
                for system in systems[turn % len(systems):] + systems[:turn % len(systems)]:
                    p50[system].append(wrk(running[system].url, scripts[system], 1, args.seconds, log)["p50_ms"])
                print(f"{model} turn {turn + 1}: " + ", ".join(f"{s} {p50[s][-1]:.1f} ms" for s in systems), flush=True)
        finally:
            for run in running.values():
                run.stop()
        lines += [f"## {model}", "", "| system | p50 ms, median [min–max] | / plain Flask's, per turn [min–max] |",
                  "| --- | --- | --- |"]
        for system in systems:
            ratios = [a / b for a, b in zip(p50[system], p50.get("flask", p50[system]))]
            times = p50[system]
            lines.append(f"| {LABELS[system]} | {statistics.median(times):.1f} [{min(times):.1f}–{max(times):.1f}] | "
                         f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] |")
        lines.append("")
    save("single-client", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

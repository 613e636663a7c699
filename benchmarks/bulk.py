"""A bulk job against the in-process ceiling: how close the job path comes to the model alone.

    python -m benchmarks.bulk [--items 8000] [--rounds 2] [--duration 10] [--store model_store] [--before DIR]

The ceiling is benchmarks/peers/ceiling.py on one sentence: the text model
in-process, batches of 32, each item tokenized again (`batch32_pre`: all a
server does but HTTP and queues). Funnel is a stack as `funnel up` starts it
(one text-embedding worker, ONNX on the CPU, its defaults), sent a bulk job of
--items copies of the same sentence through funnel_client and timed from the
submit's answer (its items stored, none run yet) to the status that says every
item is done. Each round runs both, the ceiling first; the table gives each
round and the median ratio, and goes to benchmarks/results/bulk-<date>.md with
the machine.

--before DIR (a checkout of an older Funnel, e.g. `git worktree add
/tmp/before <commit>`) runs a second stack, web tier and worker from that
checkout, beside this one's: each round sends both the same job, the order
alternating, so that the table compares them on the same minutes of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks import commit_of, save
from benchmarks.core import machine
from benchmarks.measure import run_ceiling
from benchmarks.payloads import Payload
from funnel.scripts.stack import Stack
from funnel_client import Client
from funnel_client.client import JOB_FINAL_STATES

MODEL = "text-embedding"
SENTENCE = "A man is eating food on a sunny afternoon in the park."
POLL_S = 0.25  # a status read costs the web tier CPU the model could use; 0.25 s is 1% of a job of 8000


def ceiling(args, work: Path, log) -> float:
    """Items/s of the model in-process at batch 32, each item tokenized again."""
    options = SimpleNamespace(duration=args.duration, store=args.store, device="cpu", web_processes=0)
    payload = Payload(json.dumps({"text": SENTENCE}).encode(), "application/json", "one sentence")
    return float(run_ceiling(MODEL, "onnx", options, work, payload, log)["batch32_pre"])


def bulk_job(url: str, items: int) -> float:
    """Items/s of one bulk job of `items` copies of the sentence, from its submit's answer to done."""
    with Client(url, timeout=300) as client:
        job = client.submit_job(MODEL, [SENTENCE] * items)
        started = time.monotonic()
        while True:
            status = client.job_status(job["id"])
            if status["state"] in JOB_FINAL_STATES:
                break
            time.sleep(POLL_S)
        seconds = time.monotonic() - started
    if status["state"] != "done" or status["progress"]["done"] != items:
        raise RuntimeError(f"the job ended {status['state']} with {status['progress']}")
    return items / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8000, help="texts in each bulk job")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10, help="seconds of each ceiling measurement")
    parser.add_argument("--store", default="model_store")
    parser.add_argument("--before", type=Path, help="a checkout whose stack runs the same jobs beside this one's")
    args = parser.parse_args(argv)
    rows: list[tuple[str, int, float, float]] = []  # code, round, ceiling, job
    with tempfile.TemporaryDirectory(prefix="funnel-bulk-") as tmp, contextlib.ExitStack() as stacks:
        work = Path(tmp)
        codes = {"now": stacks.enter_context(Stack(model_store=args.store, models=[MODEL], log_dir=work / "now"))}
        if args.before:
            env = {"PYTHONPATH": str(funnel_from(args.before, work))}
            codes[f"before ({commit_of(args.before)})"] = stacks.enter_context(Stack(
                model_store=args.store, models=[MODEL], log_dir=work / "before", web_env=env, worker_env=env))
        for stack in codes.values():
            bulk_job(stack.url, 320)  # warm-up: connections, the worker's cost fit
        with open(work / "ceiling.log", "w") as log:
            for round_ in range(args.rounds):
                top = ceiling(args, work, log)
                for code in (list(codes) if round_ % 2 == 0 else list(codes)[::-1]):
                    rate = bulk_job(codes[code].url, args.items)
                    rows.append((code, round_ + 1, top, rate))
                    print(f"round {round_ + 1}: ceiling {top:.0f} items/s, {code}: bulk job {rate:.0f} "
                          f"({rate / top:.2f})", flush=True)
    table = ["| code | round | ceiling items/s (in-process, batch 32, tokenized) | bulk job items/s | of the ceiling |",
             "|---|---|---|---|---|"]
    table += [f"| {code} | {n} | {top:.0f} | {rate:.0f} | {rate / top:.2f} |" for code, n, top, rate in rows]
    medians = [f"{code} **{statistics.median(r / t for c, _, t, r in rows if c == code):.2f}**" for code in codes]
    report = (f"# A bulk job against the in-process ceiling, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
              f"Machine: {machine()}\n\nCommand: `python -m benchmarks.bulk "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}` ({MODEL}, one worker at its defaults, "
              f"{args.items:,} copies of one sentence a job)\n\n" + "\n".join(table)
              + f"\n\nMedian of the ceiling: {', '.join(medians)}.\n")
    save("bulk", report)
    return 0


def funnel_from(checkout: Path, work: Path) -> Path:
    """A folder whose `funnel` is the checkout: first on PYTHONPATH, its code runs instead of this one's."""
    tree = work / "before-path"
    tree.mkdir()
    (tree / "funnel").symlink_to(checkout.resolve(), target_is_directory=True)
    return tree


if __name__ == "__main__":
    raise SystemExit(main())

"""The first request after a worker starts, against the steady state: what the warm-up buys.

    python -m benchmarks.first_request [--starts 3] [--requests 30] [--model text-embedding] [--before DIR]

Run from the repository root. Each start is a fresh stack (private Redis,
the web tier, one worker for the model, ONNX on this machine's device as
`funnel up` runs it); once the worker has registered, one request is sent,
then --requests more one after another. Reported: the first request's
latency and the model time its answer names (meta.infer_ms: collating and
running its batch), against the medians of the rest. The web tier is as
cold as the worker, so the first latency holds its first request too; the
model time is the worker's alone. --before DIR runs every start a second
time with that checkout's worker (a checkout before the warm-up), the order
alternating. Saves the table under benchmarks/results/first-request-<date>.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import save
from benchmarks.accelerator import link_tree
from benchmarks.core import SENTENCE, machine
from benchmarks.payloads import IMAGE, cat_jpeg
from funnel.scripts.stack import Stack
from tests.support import http


def ask(url: str, model: str, image: bytes) -> tuple[float, float]:
    """(latency ms, meta.infer_ms) of one request."""
    if model == IMAGE:
        request = {"body": image, "headers": {"Content-Type": "image/jpeg"}}
    else:
        request = {"body": json.dumps({"text": SENTENCE}).encode(), "headers": {"Content-Type": "application/json"}}
    started = time.perf_counter()
    status, answer, _ = http("POST", f"{url}/v1/models/{model}/predict", **request)
    latency = (time.perf_counter() - started) * 1000
    if status != 200:
        raise RuntimeError(f"{status}: {answer}")
    return latency, float(answer["meta"]["infer_ms"])


def one_start(model: str, requests: int, worker_path: Path | None, log_dir: Path, image: bytes) -> dict:
    env = {"PYTHONPATH": str(worker_path)} if worker_path else {}
    with Stack(models=[model], workers=[model], worker_env=env, log_dir=log_dir) as stack:
        first = ask(stack.url, model, image)
        rest = [ask(stack.url, model, image) for _ in range(requests)]
    return {"first_ms": first[0], "first_infer_ms": first[1], "steady_ms": statistics.median(r[0] for r in rest),
            "steady_infer_ms": statistics.median(r[1] for r in rest)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_request", description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--model", default="text-embedding")
    parser.add_argument("--before", type=Path, help="a checkout whose worker (without the warm-up) runs beside")
    args = parser.parse_args(argv)
    image = cat_jpeg()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="funnel-first-") as tmp:
        work = Path(tmp)
        codes: list[tuple[str, Path | None]] = [("warmed up (this checkout)", None)]
        if args.before:
            codes.append(("cold (before)", link_tree(args.before, work)))
        for start in range(args.starts):
            for code, path in codes if start % 2 == 0 else codes[::-1]:
                got = one_start(args.model, args.requests, path, work, image)
                results.setdefault(code, []).append(got)
                print(f"start {start + 1}, {code}: first {got['first_ms']:.1f} ms (model {got['first_infer_ms']:.1f}), "
                      f"then {got['steady_ms']:.1f} ms (model {got['steady_infer_ms']:.1f})", flush=True)
    table = ["| worker | first request ms [each start] | its model ms | steady ms (median) | steady model ms |",
             "|---|---|---|---|---|"]
    for code, got in results.items():
        firsts = ", ".join(f"{g['first_ms']:.1f}" for g in got)
        table.append(f"| {code} | {statistics.median(g['first_ms'] for g in got):.1f} [{firsts}] "
                     f"| {statistics.median(g['first_infer_ms'] for g in got):.1f} "
                     f"| {statistics.median(g['steady_ms'] for g in got):.1f} "
                     f"| {statistics.median(g['steady_infer_ms'] for g in got):.1f} |")
    report = (f"# The first request after a worker starts, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
              f"Machine: {machine()}\n\nCommand: `python -m benchmarks.first_request "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}` ({args.model}, {args.starts} starts "
              f"per worker, then {args.requests} sequential requests each; medians over the starts)\n\n"
              + "\n".join(table) + "\n")
    save("first-request", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

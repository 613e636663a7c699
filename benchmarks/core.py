"""Core numbers: single-request latency per model, and text-embedding throughput at 32 clients.

    python -m benchmarks.core [--duration 15] [--requests 200]

Run from the repository root. Starts the stack the way `make up` does (private
Redis, gunicorn web tier, one worker per model), measures, stops it, and compares
against in-process batched inference with the same ONNX model (the ceiling, no
HTTP, no Redis). Prints a Markdown table and saves it under benchmarks/results/
with the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT, save
from benchmarks.machine import cpu_model
from funnel.scripts.stack import Stack
from tests.support import http, jpeg_bytes

SENTENCE = "A man is eating a piece of bread while the girl is carrying a baby."
BODY = f'{{"text": "{SENTENCE}"}}'
# The same sentence through the Open Inference Protocol (/v2/models/text-embedding/infer).
V2_BODY = f'{{"inputs": [{{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["{SENTENCE}"]}}]}}'
WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
"""


def machine() -> str:
    try:  # absent where torch alone runs the models (a GPU machine without onnxruntime)
        import onnxruntime

        runtime = f"onnxruntime {onnxruntime.__version__}, "
    except ImportError:
        runtime = ""
    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{runtime}{platform.system()} {platform.release()}")


def latency_ms(url: str, n: int, **request) -> tuple[float, float]:
    """Sequential requests, one at a time: (p50, p99) in ms."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        status, body, _ = http("POST", url, **request)
        assert status == 200, body
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def wrk(url: str, connections: int, duration_s: int, body: str = BODY) -> dict:
    """requests/s and latency percentiles from wrk with a JSON POST body."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_LUA.format(body=body) + """
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f\\n", summary.requests, summary.errors.status,
    summary.duration, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
""")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--timeout", "30s",
                          "-s", script.name, url], capture_output=True, text=True, check=True).stdout
    os.unlink(script.name)
    requests, errors, duration_us, p50, p99 = re.search(r"RESULT (\S+) (\S+) (\S+) (\S+) (\S+)", out).groups()
    return {"rps": int(requests) / (int(duration_us) / 1e6), "errors": int(errors),
            "p50": float(p50), "p99": float(p99)}


def in_process_ceiling(batch: int, seconds: float = 5.0) -> float:
    """Items/s of the same ONNX model called directly, batch after batch."""
    from funnel.common import tasks
    from funnel.common.store import load_spec
    from funnel.worker.backend import load

    spec = load_spec(ROOT / "model_store", "text-embedding")
    model = load(spec, "onnx", "cpu")
    task = tasks.load(spec)
    feeds = task.collate([task.preprocess(SENTENCE)] * batch)
    model.run(feeds)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.run(feeds)
        done += batch
    return done / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds of each wrk run")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency figure")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    from skimage import data

    cat = jpeg_bytes(data.chelsea())
    rows = []
    ceiling = {b: in_process_ceiling(b) for b in (1, 32)}
    for batch in (1, 32):
        with Stack(worker_env={"FUNNEL_BATCH_SIZE": str(batch)},
                   log_dir=ROOT / "benchmarks" / "results" / "tmp") as stack:
            text_url = f"{stack.url}/v1/models/text-embedding/predict"
            if batch == 32:  # latency at default settings
                for model, request in [
                        ("text-embedding", {"json_body": {"text": SENTENCE}}),
                        ("image-classifier", {"body": cat, "headers": {"Content-Type": "image/jpeg"}})]:
                    url = f"{stack.url}/v1/models/{model}/predict"
                    latency_ms(url, 20, **request)  # warm-up
                    p50, p99 = latency_ms(url, args.requests, **request)
                    rows.append((f"{model}, 1 client, sequential", "", f"{p50:.1f}", f"{p99:.1f}", ""))
            wrk(text_url, 32, 3)  # warm-up
            result = wrk(text_url, 32, args.duration)
            rows.append((f"text-embedding, 32 clients, worker batch {batch}", f"{result['rps']:.0f}",
                         f"{result['p50']:.1f}", f"{result['p99']:.1f}",
                         f"{result['rps'] / ceiling[32]:.2f}"))
            assert result["errors"] == 0, result
    rows.append(("in-process ONNX, batch 1 (no HTTP, no Redis)", f"{ceiling[1]:.0f}", "", "",
                 f"{ceiling[1] / ceiling[32]:.2f}"))
    rows.append(("in-process ONNX, batch 32 (the ceiling)", f"{ceiling[32]:.0f}", "", "", "1.00"))

    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    table = ["| case | req/s (items/s) | p50 ms | p99 ms | vs ceiling |", "|---|---|---|---|---|"]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    report = (f"# Core numbers, {stamp}\n\nMachine: {machine()}\n\n"
              f"Command: `python -m benchmarks.core --duration {args.duration} --requests {args.requests}` "
              f"(wrk -t1 -c32, one {len(SENTENCE.split())}-word sentence per POST; default web settings, "
              f"ONNX backend, adaptive linger of at most 5 ms)\n\n" + "\n".join(table) + "\n")
    save("core", report)
    shutil.rmtree(ROOT / "benchmarks" / "results" / "tmp", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stress a Funnel server: N clients at once, M requests each, then latency and throughput.

    python scripts/stress_test.py --clients 32 --requests 50 --model text-embedding --text "hello"
    python scripts/stress_test.py --clients 8 --requests 20 --model image-classifier --image cat.jpg

Every client is a thread with its own keep-alive connection (common/client.py);
they all start together and each sends its requests one after the other.
503s are not retried unless --retries says so, so overload shows up as
errors. The run is bounded: clients x requests requests, each within
--timeout seconds. Exit status 0 when every request succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from funnel_client import Client, FunnelHTTPError, read_image

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TEXT = "A man is eating food."
LATENCY_COLUMNS = ("mean", "std", "p50", "p90", "p99", "max")


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linearly interpolated."""
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def error_key(exc: FunnelHTTPError) -> str:
    """How an error is counted: its HTTP status, or what went wrong when no answer came."""
    return str(exc.status) if exc.status is not None else exc.code


def run(client: Client, model: str, inputs: dict, clients: int, requests: int,
        warmup: int = 1, progress: bool = True) -> dict:
    """Send clients x requests predicts from `clients` threads; return the numbers."""
    from tqdm import tqdm

    for _ in range(warmup):  # loads the worker's session and warms the connection, off the clock
        try:
            client.predict(model, **inputs)
        except FunnelHTTPError:
            pass
    latencies: list[float] = []  # seconds, successful requests only
    errors: Counter[str] = Counter()
    examples: dict[str, str] = {}
    lock = threading.Lock()
    bar = tqdm(total=clients * requests, unit="req", desc=model, disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    start = threading.Barrier(clients + 1)

    def one_client() -> None:
        start.wait()
        for _ in range(requests):
            began = time.perf_counter()
            try:
                client.predict(model, **inputs)
            except FunnelHTTPError as exc:
                with lock:
                    errors[error_key(exc)] += 1
                    examples.setdefault(error_key(exc), f"{exc.code}: {exc.message}")
                    bar.update(1)
                continue
            except Exception as exc:  # a bug, not the server's answer: count it all the same
                with lock:
                    errors[type(exc).__name__] += 1
                    examples.setdefault(type(exc).__name__, str(exc))
                    bar.update(1)
                continue
            elapsed = time.perf_counter() - began
            with lock:
                latencies.append(elapsed)
                bar.update(1)

    threads = [threading.Thread(target=one_client, name=f"stress-{i}", daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    bar.close()

    ordered = sorted(latencies)
    ms = [v * 1000 for v in ordered]
    return {
        "model": model, "clients": clients, "requests_per_client": requests,
        "sent": clients * requests, "ok": len(latencies), "errors": dict(sorted(errors.items())),
        "error_examples": examples, "wall_s": wall,
        "throughput_rps": len(latencies) / wall if wall > 0 else math.nan,
        "latency_ms": {
            "mean": statistics.fmean(ms) if ms else math.nan,
            "std": statistics.stdev(ms) if len(ms) > 1 else 0.0 if ms else math.nan,
            "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
            "max": ms[-1] if ms else math.nan,
        },
    }


def report(result: dict, url: str) -> str:
    lat = result["latency_ms"]
    errors = result["errors"]
    lines = [
        f"target       {url}  model {result['model']}",
        f"requests     {result['sent']} ({result['clients']} clients x {result['requests_per_client']})",
        f"succeeded    {result['ok']}",
        f"failed       {sum(errors.values())}"
        + (" (" + ", ".join(f"{k}: {v}" for k, v in errors.items()) + ")" if errors else ""),
        f"wall time    {result['wall_s']:.2f} s",
        f"throughput   {result['throughput_rps']:.1f} req/s (successful)",
        "",
        "latency ms  " + "".join(f"{k:>8}" for k in LATENCY_COLUMNS),
        "            " + "".join(f"{lat[k]:>8.1f}" for k in LATENCY_COLUMNS),
    ]
    for key, example in result["error_examples"].items():
        lines.append(f"error {key}: {example}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python scripts/stress_test.py",
        description="Send a Funnel server many requests from many clients at once, then print latency "
                    "(mean, std, p50, p90, p99, max over successful requests), throughput, and errors by "
                    "HTTP status.",
        epilog="Only point it at a server you run: it sends --clients x --requests requests as fast as "
               "the server answers.")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server to load (default {DEFAULT_URL})")
    p.add_argument("--model", default=None,
                   help="model to call (default text-embedding, or image-classifier with --image)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--text", help=f"text each request embeds (default {DEFAULT_TEXT!r})")
    source.add_argument("--image", help="image file each request classifies (read once, sent every time)")
    p.add_argument("--clients", type=int, default=8, help="simultaneous clients, one thread each (default 8)")
    p.add_argument("--requests", type=int, default=20,
                   help="requests each client sends, one after the other (default 20)")
    p.add_argument("--warmup", type=int, default=1,
                   help="requests sent before the clock starts, not counted (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer (default 60)")
    p.add_argument("--retries", type=int, default=0,
                   help="retries of a 503 after its Retry-After (default 0: count it as an error)")
    p.add_argument("--api-key", default=os.environ.get("FUNNEL_API_KEY"),
                   help="Bearer key, when the server has FUNNEL_API_KEYS (default $FUNNEL_API_KEY)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.warmup < 0:
        p.error("--clients and --requests must be at least 1, --warmup at least 0")
    if args.model is None:
        args.model = "image-classifier" if args.image else "text-embedding"
    if args.image:
        try:
            inputs = {"image": read_image(args.image)[0]}
        except OSError as exc:
            p.error(f"cannot read --image: {exc}")
    else:
        inputs = {"text": args.text if args.text is not None else DEFAULT_TEXT}
    with Client(args.url, api_key=args.api_key, timeout=args.timeout, retries=args.retries) as client:
        result = run(client, args.model, inputs, args.clients, args.requests,
                     warmup=args.warmup, progress=not args.no_progress)
    print(report(result, client.url), flush=True)
    if args.json:
        clean = json.loads(json.dumps({"url": client.url, **result}),
                           parse_constant=lambda _: None)  # NaN (no successes) becomes null
        Path(args.json).write_text(json.dumps(clean, indent=2) + "\n")
    return 0 if result["ok"] == result["sent"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load shedding at about four times a stack's capacity: what is answered, what is turned away, how fast.

    python -m benchmarks.shedding [--seconds 60]

First the model's capacity is measured with a closed loop and a long deadline;
then requests arrive at four times that rate (open loop) for `seconds`, each
with its own deadline of 1, 2 or 3 s in X-Request-Timeout. Here: the image
classifier on the CPU, its worker held to one thread and batches of 2 so the
model is the bottleneck, where the web tier's decoding and this load generator
share the cores with it (on 2 cores the client's own CPU starves the worker:
read the figures of a machine with 4 or more). The suite runs the same on a
paced toy model, whose speed no CPU moves (tests/faults/test_load_shedding.py).
Written to benchmarks/results/shedding-<date>.md with the machine.
"""

from __future__ import annotations

import argparse
import io
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks import save
from benchmarks.core import machine
from funnel.scripts.stack import Stack
from tests.support import STORE, http, wait_for

IMAGE = "image-classifier"
DEADLINES_S = (1.0, 2.0, 3.0)
SLACK_S = 0.5  # the client's own share: upload, preprocessing, the answer's way back
Post = Callable[[float], tuple[int, dict, dict, float]]


def poster(stack, model: str, body: bytes, content_type: str) -> Post:
    def post(deadline_s: float):
        started = time.monotonic()
        status, answer, headers = http("POST", f"{stack.url}/v1/models/{model}/predict", body=body,
                                       headers={"Content-Type": content_type, "X-Request-Timeout": f"{deadline_s:g}"},
                                       timeout=30)
        return status, answer, headers, time.monotonic() - started
    return post


def capacity(post: Post, seconds=6.0, clients=8) -> float:
    """Answers per second with enough clients to keep the worker's batches full and no shedding."""
    stop, done = time.monotonic() + seconds, Counter()

    def loop(_):
        while time.monotonic() < stop:
            done[post(10)[0]] += 1

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(loop, range(clients)))
    assert set(done) == {200}, done
    return done[200] / (time.monotonic() - started)


@dataclass
class Shed:
    """One overload run: every request's (status, seconds, deadline, Retry-After, body)."""

    label: str
    rate: float  # the capacity measured, answers per second
    offered: float
    duration_s: float
    elapsed_s: float = 0.0
    results: list[tuple] = field(default_factory=list)

    @property
    def ok(self) -> list[tuple]:
        return [r for r in self.results if r[0] == 200]

    @property
    def shed(self) -> list[tuple]:
        return [r for r in self.results if r[0] == 503]

    @property
    def throughput(self) -> float:
        return len(self.ok) / self.elapsed_s

    def problems(self) -> list[str]:
        """What broke the contract: a 504 or another status, an accepted request past its deadline,
        the excess not turned away at once with a computed Retry-After, capacity lost to refusing."""
        statuses = Counter(r[0] for r in self.results)
        late = [r for r in self.ok if r[1] > r[2] + SLACK_S]
        retry_after = Counter(r[3] for r in self.shed)
        checks = [
            (set(statuses) <= {200, 503}, f"statuses {dict(statuses)}: nothing accepted may run out of time"),
            (not late, f"{len(late)} answers past their deadline + {SLACK_S} s"),
            (all(r[4]["error"]["code"] == "overloaded" for r in self.shed), "a 503 not `overloaded`"),
            (len(self.shed) > len(self.results) / 2, "most of the excess not turned away"),
            (not self.shed or max(r[1] for r in self.shed) < 1.0, "a 503 slower than a second"),
            (all(ra and int(ra) >= 1 for ra in retry_after) and len(retry_after) >= 2, "Retry-After a constant"),
            (self.throughput > 0.8 * self.rate, f"answered {self.throughput:.1f}/s of a {self.rate:.1f}/s capacity"),
        ]
        return [what for held, what in checks if not held]

    def summary(self) -> str:
        statuses = Counter(r[0] for r in self.results)
        late = [r for r in self.ok if r[1] > r[2] + SLACK_S]
        return (f"{self.label}: capacity {self.rate:.1f}/s, offered {self.offered:.1f}/s for {self.duration_s:g} s: "
                f"{dict(statuses)}; answered {self.throughput:.1f}/s ({self.throughput / self.rate:.0%} of capacity); "
                f"slowest 200 {max((r[1] for r in self.ok), default=0):.2f} s; 503 in at most "
                f"{max((r[1] for r in self.shed), default=0):.2f} s; Retry-After "
                f"{dict(sorted(Counter(r[3] for r in self.shed).items()))}; 200s past deadline+{SLACK_S}: {len(late)}")


def overload(stack, post: Post, label: str, duration_s: float) -> Shed:
    """Measure capacity, offer four times it for duration_s, and keep what came back."""
    client = redis.Redis.from_url(stack.redis_url)
    capacity(post, seconds=2)  # warm up
    wait_for(lambda: any(client.hget(k, "item_seconds") for k in client.keys("funnel:worker:*")),
             what="the worker's batch cost in the registry")
    rate = capacity(post)
    run = Shed(label, rate, 4 * rate, duration_s)
    lock = threading.Lock()

    def one(deadline_s):
        status, answer, headers, seconds = post(deadline_s)
        with lock:
            run.results.append((status, seconds, deadline_s, headers.get("Retry-After"), answer))

    started = time.monotonic()
    with ThreadPoolExecutor(160) as pool:  # open loop: a request every 1/offered s, whatever came back
        for i in range(int(duration_s * run.offered)):
            time.sleep(max(0.0, started + i / run.offered - time.monotonic()))
            pool.submit(one, DEADLINES_S[i % len(DEADLINES_S)])
    run.elapsed_s = time.monotonic() - started
    return run


def small_cat() -> bytes:
    """The cat at 384x256: cheap for the web tier to decode, so the model stays the bottleneck."""
    from PIL import Image
    from skimage import data

    out = io.BytesIO()
    Image.fromarray(data.chelsea()).resize((384, 256)).save(out, format="JPEG", quality=85)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shedding", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long four times the capacity is offered")
    parser.add_argument("--store", default=str(STORE))
    args = parser.parse_args(argv)
    with Stack(model_store=Path(args.store), models=[IMAGE],
               worker_env={"FUNNEL_BATCH_SIZE": "2", "FUNNEL_INTRA_OP_THREADS": "1", "FUNNEL_HEARTBEAT_TTL_S": "3"},
               web_env={"FUNNEL_REQUEST_TIMEOUT_S": "10"}) as stack:
        run = overload(stack, poster(stack, IMAGE, small_cat(), "image/jpeg"), "image model on the CPU", args.seconds)
    problems = run.problems()
    save("shedding", "\n".join([
        "# Load shedding at four times the capacity", "", f"Machine: {machine()}", "",
        f"Command: `python -m benchmarks.shedding --seconds {args.seconds:g}` (the image classifier, one worker "
        "held to one thread and batches of 2; deadlines of 1, 2 and 3 s in turn)", "",
        run.summary(), "", "Problems: " + ("; ".join(problems) if problems else "none"), ""]))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

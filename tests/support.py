"""What the tests share: HTTP and waiting helpers, reference inputs and outputs, running a worker or a
web tier, the fault suite's load, outcome and table (tests/conftest.py and tests/faults/conftest.py
hold the fixtures)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis
from werkzeug.datastructures import Headers

from funnel.common import tasks
from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import scan_keys
from funnel.scripts.stack import Stack
from tests import toy_model

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "model_store"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse on a sunny day in the hills."]


def text_feeds(spec, texts=SENTENCES) -> dict[str, np.ndarray]:
    """The worker's batch for these texts, as the web would send them."""
    task = tasks.load(spec)
    return task.collate([task.preprocess(t) for t in texts])


def image_feeds(spec, images: list[bytes]) -> dict[str, np.ndarray]:
    task = tasks.load(spec)
    return task.collate([task.preprocess(b) for b in images])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row cosine similarity (fp16 embeddings are only nearly unit length)."""
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def jpeg_bytes(array: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None,
         json_body=None, timeout: float = 60) -> tuple[int, dict, Headers]:
    """One HTTP call: (status, decoded JSON body or {}, headers, looked up by any case)."""
    import json
    import urllib.error
    import urllib.request

    headers = dict(headers or {})
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, raw, hdrs = response.status, response.read(), Headers(response.headers.items())
    except urllib.error.HTTPError as err:
        status, raw, hdrs = err.code, err.read(), Headers(err.headers.items())
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, {"_text": raw.decode(errors="replace")}, hdrs


def multipart(field: str, filename: str, data: bytes, content_type: str = "image/jpeg"):
    """A multipart/form-data body with one file field: (body, headers)."""
    boundary = "funnel-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n").encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def metric(text: str, name: str, *, absent: float | None = None, **labels) -> float:
    """The sum of a Prometheus metric's samples whose labels match, from /metrics text (`absent`
    where none does: a counter not yet counted; None, the default: fail)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
    if not found and absent is not None:
        return absent
    assert found, f"{name} {labels} not in /metrics"
    return total


class WebhookReceiver:
    """A webhook endpoint on 127.0.0.1 (http.server on a thread): records every delivery and answers
    each with the next of `statuses` (then 200); a status of None holds the request unanswered until
    release() (a receiver that hangs)."""

    def __init__(self, statuses: list[int | None] | None = None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.statuses = list(statuses or [])
        self.deliveries: list[tuple[dict, bytes]] = []
        self.paths: list[str] = []
        self.arrived = threading.Condition()
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.arrived:
                    receiver.deliveries.append((dict(self.headers), body))
                    receiver.paths.append(self.path)
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.arrived.notify_all()
                if status is None:
                    receiver.released.wait(60)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hooks/funnel?source=test"

    def wait_for(self, count: int, timeout_s: float = 30) -> list[tuple[dict, bytes]]:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.deliveries) >= count, timeout=timeout_s):
                raise TimeoutError(f"{len(self.deliveries)} webhook deliveries after {timeout_s} s, not {count}")
            return list(self.deliveries)

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def running_worker(redis_server, store, model: str = "text-embedding", worker_id: str = "test-worker", **flags):
    """A worker (serve() on a thread of this process) for `model` as --model takes it, NAME or NAME:N;
    flags are its other options (batch_size=16 -> --batch-size 16)."""
    from funnel.worker.main import serve
    from funnel.worker.settings import WorkerSettings

    argv = ["--model", model, "--model-store", str(store), "--redis-url", redis_server.url, "--worker-id", worker_id]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(WorkerSettings.load(argv), stop), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def flask_app(redis_server, model_store, prefix: str, *argv: str):
    """The web tier's Flask app (the routes it answers) in this process, against this Redis."""
    from funnel.web.app import catalog_of, create_app
    from funnel.web.pipeline import Pipeline
    from funnel.web.settings import WebSettings

    settings = WebSettings.load(["--redis-url", redis_server.url, "--model-store", str(model_store),
                                 "--prefix", prefix, *argv])
    pipeline = Pipeline(catalog_of(settings), redis.Redis.from_url(redis_server.url), Keys(prefix), settings)
    return create_app(settings, pipeline)


TEXT = "text-embedding"
FAST_HEARTBEAT = {"FUNNEL_HEARTBEAT_TTL_S": "2"}


def cached_store(model_store: Path, root: Path, model: str = TEXT, versions: tuple[int, ...] = (1,), **cache) -> Path:
    """The shipped model as these versions, its files linked, its model.json caching results."""
    store = root / "cached-store"
    for version in versions:
        folder = store / model / str(version)
        folder.mkdir(parents=True)
        for path in (model_store / model).iterdir():
            if path.name != "model.json":
                (folder / path.name).symlink_to(path)
        meta = json.loads((model_store / model / "model.json").read_text())
        (folder / "model.json").write_text(json.dumps({**meta, "cache": {"ttl_s": 600, **cache}}))
    return store


# tests/third_party/toyscore's PacedScore: its workers and web tier need PACED_ENV to import it.
PACED = "paced-score"
PACE_S = 1.5
PACED_ENV = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}


@dataclass
class Outcome:
    """What a run of requests came to: the closing note's fault table is made of these."""
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    wrong: int = 0  # answered 200 with somebody else's result
    slowest_s: float = 0.0

    def add(self, status: int, seconds: float, correct: bool = True) -> None:
        self.sent += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.wrong += status == 200 and not correct
        self.slowest_s = max(self.slowest_s, seconds)

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} request {i}: {'the quick brown fox ' * (i % 5)}jumps" for i in range(n)]


def send_texts(stack: Stack, batch: list[str], expected: dict, outcome: Outcome,
               clients: int = 16, progress: threading.Semaphore | None = None) -> None:
    """POST each text to the text model, checking each 200's embedding against expected[text]."""
    send(stack, TEXT, batch, lambda text: {"text": text},
         lambda text, body: np.allclose(body["embedding"], expected[text], atol=1e-4),
         outcome, clients, progress)


def send_vectors(stack: Stack, batch: list[list[float]], expected: dict, outcome: Outcome,
                 clients: int = 16, progress: threading.Semaphore | None = None) -> None:
    """POST each vector to the paced toy scorer (PACED), checking each 200's scores against
    expected[tuple(vector)] (paced_expected)."""
    send(stack, PACED, batch, lambda vector: {"input": vector},
         lambda vector, body: np.allclose(body["scores"], expected[tuple(vector)], atol=1e-5),
         outcome, clients, progress)


def send(stack: Stack, model: str, batch: list, body: Callable[[Any], dict], correct: Callable[[Any, dict], bool],
         outcome: Outcome, clients: int, progress: threading.Semaphore | None) -> None:
    """POST one request per item of batch from `clients` threads, adding each to outcome."""
    url = f"{stack.url}/v1/models/{model}/predict"

    def one(item) -> None:
        started = time.monotonic()
        status, answer, _ = http("POST", url, json_body=body(item), timeout=60)
        ok = status != 200 or correct(item, answer)
        outcome.add(status, time.monotonic() - started, ok)
        if progress:
            progress.release()

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, batch))


def paced_expected(batch: list[list[float]]) -> dict[tuple[float, ...], np.ndarray]:
    """The toy scorer's answer to each vector, computed with numpy."""
    return dict(zip(map(tuple, batch), toy_model.expected_scores(np.array(batch))))


@contextlib.contextmanager
def load_running(stack: Stack, batch: list, expected: dict, clients: int,
                 outcome: Outcome | None = None, progress: threading.Semaphore | None = None,
                 timeout_s: float = 120, sender=send_texts):
    """sender (send_texts, send_vectors) in a background thread while the block runs; joined
    (bounded) on the way out."""
    outcome = outcome or Outcome()
    thread = threading.Thread(target=sender, args=(stack, batch, expected, outcome, clients, progress))
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(timeout=timeout_s)
    assert not thread.is_alive(), "the load did not finish in time"


def assert_each_answered_once(outcome: Outcome, sent: int, stray: int) -> None:
    assert outcome.ok == sent == outcome.sent, outcome
    assert outcome.wrong == 0 and stray == 0


def stray_replies(client: redis.Redis, stack: Stack) -> int:
    """Replies nobody read: a job answered twice leaves its second reply in a reply list, or the
    web tier's inbox finds nobody waiting for it (counted in funnel_replies_unclaimed_total)."""
    scraped = http("GET", f"{stack.url}/metrics")[1]["_text"]
    return len(list(scan_keys(client, "funnel:reply:*"))) + int(metric(scraped, "funnel_replies_unclaimed_total"))


def freeze_holding_jobs(client: redis.Redis, proc, worker_id: str, timeout_s: float = 30, model: str = TEXT) -> int:
    """SIGSTOP the worker at a moment it holds jobs; returns how many it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGSTOP)
        held = client.llen(Keys().inflight(model, worker_id))
        if held:
            return held
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise TimeoutError(f"worker {worker_id} never held a job")


def wait_for(condition, timeout_s: float = 30, interval_s: float = 0.05, what: str = "condition",
             check=None, detail=None):
    """condition()'s first true value, polled; check() runs each time (it raises when waiting is
    pointless, e.g. a process exited); detail() adds context (logs) to the timeout's message."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}"
                               + (f"\n{detail()}" if detail is not None else ""))
        time.sleep(interval_s)


FAULT_TABLE: list[tuple[str, Outcome, int]] = []


@contextlib.contextmanager
def one_paced_worker(tmp_path_factory, model: str, web_env: dict[str, str], **stack: Any) -> Iterator[Stack]:
    """A stack of one worker of the toy scorer paced at 50 ms a batch of one (a few dozen requests
    saturate it on any machine), its web tier with these settings, no deadline shedding."""
    store = tmp_path_factory.mktemp(f"{model}-store")
    toy_model.add_paced(store, tmp_path_factory.mktemp("paced"), model, 0.05, batch_size=1)
    with Stack(model_store=store, models=[model], log_dir=tmp_path_factory.mktemp(f"{model}-logs"),
               worker_env=PACED_ENV, web_env={**PACED_ENV, "FUNNEL_SHED": "0", "FUNNEL_REQUEST_TIMEOUT_S": "30",
                                              **web_env}, **stack) as running:
        yield running


def worker_totals(stack, model: str) -> tuple[float, float]:
    """The batches and items the model's workers have run, summed from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body, _ = http("GET", f"{stack.url}/metrics")
    assert status == 200
    text = body["_text"]
    totals = {"batches": 0.0, "items": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name in totals:
                if sample.name == f"funnel_worker_{name}_total" and sample.labels.get("model") == model:
                    totals[name] += sample.value
    return totals["batches"], totals["items"]

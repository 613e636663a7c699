"""Shared fixtures: a real redis-server on a free port, the prepared model store, test images."""

from __future__ import annotations

import io
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import redis
from werkzeug.datastructures import Headers

from funnel.common.keys import Keys
from funnel.scripts.redis_local import LocalCluster, LocalRedis, LocalSentinels

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "model_store"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse on a sunny day in the hills."]


@pytest.fixture(scope="session")
def model_store() -> Path:
    """The store `make test` prepared (prepared here if the suite runs on its own)."""
    from funnel.scripts.prepare_model import DEFAULT_MODELS, is_current, prepare

    for name in DEFAULT_MODELS:
        if not is_current(STORE / name):
            prepare(STORE, name)
    return STORE


@pytest.fixture(scope="session")
def fp16_store(model_store, tmp_path_factory) -> Path:
    """A store with both fp16 variants (prepare_model.py --half), built once beside links to
    the fp32 folders."""
    from funnel.scripts.prepare_model import DEFAULT_MODELS, prepare_half

    store = tmp_path_factory.mktemp("fp16-store")
    for name in DEFAULT_MODELS:
        (store / name).symlink_to(model_store / name, target_is_directory=True)
        prepare_half(store, name)
    return store


def text_feeds(spec, texts=SENTENCES) -> dict[str, np.ndarray]:
    """The worker's batch for these texts, as the web would send them."""
    from funnel.common import tasks

    task = tasks.load(spec)
    return task.collate([task.preprocess(t) for t in texts])


def image_feeds(spec, images: list[bytes]) -> dict[str, np.ndarray]:
    from funnel.common import tasks

    task = tasks.load(spec)
    return task.collate([task.preprocess(b) for b in images])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row cosine similarity (fp16 embeddings are only nearly unit length)."""
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="session")
def redis_server():
    with LocalRedis() as server:
        yield server


@pytest.fixture()
def sentinels():
    """A primary, a replica and three Sentinels on 127.0.0.1, fresh for each test (a failover
    changes which is the primary): FUNNEL_REDIS_URL is sentinels.url."""
    with LocalSentinels() as deployment:
        yield deployment


@pytest.fixture(scope="module")
def redis_cluster():
    """Three cluster-enabled primaries on 127.0.0.1 joined by `redis-cli --cluster create`, up to
    cluster_state:ok: FUNNEL_REDIS_URL is redis_cluster.url (redis+cluster://)."""
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture()
def redis_client(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def keys() -> Keys:
    return Keys("funnel")


def jpeg_bytes(array: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture(scope="session")
def cat_jpeg() -> bytes:
    """scikit-image's bundled photo of Chelsea the cat, as a JPEG."""
    from skimage import data

    return jpeg_bytes(data.chelsea())


@pytest.fixture(scope="session")
def coffee_jpeg() -> bytes:
    from skimage import data

    return jpeg_bytes(data.coffee())


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


def metric(text: str, name: str, **labels) -> float:
    """The sum of a Prometheus metric's samples whose labels match, from /metrics text."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
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

"""The chaos soak's traffic (benchmarks/chaos.py): reference answers, the clients, the bulk jobs.

Every request is one of a fixed set of distinct inputs whose answer was computed
up front in this process, with onnxruntime on model_store/<m>/model.onnx and
the model's own task (preprocess, collate, postprocess): an answer that is not
its input's is a wrong answer. Each request opens its own connection, so a
status-less ending is told apart: `refused` (nothing sent), `reset` (the
connection dropped before an answer), `timeout` (no answer within the deadline
plus CLIENT_MARGIN_S), `hung_up` (the client closed on purpose).
"""

from __future__ import annotations

import http.client
import io
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TEXT, IMAGE = "text-embedding", "image-classifier"
CLIENT_MARGIN_S = 5.0   # a client waits this long past its request's deadline for an answer
PROB_ATOL = 2e-3        # an image answer's probabilities against the in-process ones (batched vs alone)
EMBED_ATOL = 1e-4

WORDS = ("river", "lantern", "copper", "meadow", "violin", "harbor", "glacier", "orchard", "falcon", "ember",
         "canyon", "saffron", "timber", "quartz", "willow", "mosaic")


def sentences(n: int) -> list[str]:
    """n distinct sentences of different lengths (so batches pad and bucket)."""
    rng = random.Random(1234)
    return [f"chaos {i}: " + " ".join(rng.choice(WORDS) for _ in range(3 + (i * 7) % 40)) for i in range(n)]


def photos() -> list[bytes]:
    """Distinct JPEGs: scikit-image's bundled colour photos, whole, mirrored and cropped."""
    from PIL import Image
    from skimage import data

    out = []
    for array in (data.chelsea(), data.coffee(), data.astronaut(), data.rocket()):
        for variant in (array, array[:, ::-1], array[array.shape[0] // 6:, array.shape[1] // 6:]):
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(variant)).save(buffer, format="JPEG", quality=88)
            out.append(buffer.getvalue())
    return out


class References:
    """The inputs the soak sends and their answers, computed with onnxruntime in this process."""

    def __init__(self, store: str | Path, n_texts: int = 64):
        import onnxruntime as ort

        from funnel.common import tasks
        from funnel.common.store import load_spec

        self.texts, self.images = sentences(n_texts), photos()
        self.embedding: dict[str, np.ndarray] = {}
        self.probabilities: dict[int, np.ndarray] = {}  # image index -> its 1000 probabilities
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        for model, items in ((TEXT, self.texts), (IMAGE, self.images)):
            spec = load_spec(str(store), model)
            task = tasks.load(spec)
            session = ort.InferenceSession(str(spec.file("onnx")), options, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            for i, item in enumerate(items):
                feeds = task.collate([task.preprocess(item)])
                row = dict(zip(names, session.run(names, feeds)))
                if model == TEXT:
                    self.embedding[item] = np.asarray(task.postprocess({k: v[0] for k, v in row.items()})["embedding"])
                else:
                    self.probabilities[i] = row["probabilities"][0]
            del session

    def text_ok(self, text: str, embedding) -> bool:
        return embedding is not None and np.allclose(embedding, self.embedding[text], atol=EMBED_ATOL)

    def image_ok(self, index: int, predictions) -> bool:
        """Each class answered has this image's probability, and the first is its top class."""
        if not predictions:
            return False
        ref = self.probabilities[index]
        return (all(abs(p["probability"] - float(ref[p["index"]])) <= PROB_ATOL for p in predictions)
                and predictions[0]["probability"] >= float(ref.max()) - PROB_ATOL)


@dataclass
class Request:
    kind: str            # v1-text, v1-texts, v1-image, v2-text, hangup
    started: float       # epoch seconds
    deadline_s: float
    ended: float = 0.0
    status: int = 0      # 0: no HTTP status (see outcome)
    outcome: str = ""    # "<status>", refused, reset, timeout, hung_up
    correct: bool | None = None  # for a 200: every answer its own input's
    error: str = ""      # the JSON error code of a non-200

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def late_s(self) -> float:
        """How far past its deadline it was answered (negative: before)."""
        return self.seconds - self.deadline_s


@dataclass
class BulkJob:
    model: str
    items: list          # texts, or image indexes
    submitted: float
    submit_status: int = 0
    job_id: str = ""
    state: str = ""      # the last state read; "lost": 404 for an acknowledged job; "timeout": not done in time
    finished: float = 0.0
    results: int = 0     # results read back, non-null
    missing: int = 0     # null or absent results of a done job
    wrong: int = 0
    failed_items: int = 0
    duplicates: int = 0  # the job record's count of second answers (read from Redis)
    polls: dict = field(default_factory=dict)  # status of each poll -> count


def _connect(port: int, timeout: float) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def call(port: int, method: str, path: str, body: bytes | None, headers: dict, timeout: float
         ) -> tuple[int, bytes, str]:
    """One request on a connection of its own: (status, body, outcome)."""
    conn = _connect(port, timeout)
    try:
        conn.connect()
    except TimeoutError:
        return 0, b"", "timeout"
    except OSError:  # refused, mostly
        return 0, b"", "refused"
    try:
        conn.request(method, path, body=body, headers={**headers, "Connection": "close"})
        response = conn.getresponse()
        return response.status, response.read(), str(response.status)
    except TimeoutError:
        return 0, b"", "timeout"
    except (ConnectionError, http.client.HTTPException, OSError):
        return 0, b"", "reset"
    finally:
        conn.close()


def _json(body: bytes) -> dict:
    try:
        value = json.loads(body)
        return value if isinstance(value, dict) else {}
    except ValueError:
        return {}


def error_of(answer: dict) -> str:
    """An error answer in a few words: /v1's code and message (nginx's own refusals share the shape
    and the code `unavailable` with the web tier's: the message tells them apart), /v2's message."""
    error = answer.get("error")
    if isinstance(error, dict):
        return f"{error.get('code', '')}: {str(error.get('message', ''))[:44]}"
    return str(error or "")[:50]


def multipart(files: list[bytes]) -> tuple[bytes, dict]:
    boundary = "chaos-soak-boundary"
    body = b""
    for i, data in enumerate(files):
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{i}.jpg\"\r\n"
                 f"Content-Type: image/jpeg\r\n\r\n").encode() + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


class Traffic:
    """Clients on threads against the front door until stopped, every request recorded."""

    KINDS = (("v1-text", 30), ("v1-texts", 10), ("v1-image", 20), ("v2-text", 15), ("hangup", 10))

    def __init__(self, port: int, refs: References, seed: int, deadline_s: float, clients: int = 6,
                 bulk_clients: int = 1, pause_s: float = 0.05, bulk: bool = True, job_timeout_s: float = 180.0,
                 image_share: float = 1.0):
        self.port, self.refs, self.seed, self.deadline_s = port, refs, seed, deadline_s
        self.clients, self.bulk_clients, self.pause_s, self.bulk = clients, bulk_clients, pause_s, bulk
        self.job_timeout_s = job_timeout_s
        self.image_share = image_share
        self.requests: list[Request] = []
        self.jobs: list[BulkJob] = []
        self.stop = threading.Event()       # no new request or job
        self.give_up = threading.Event()    # stop polling jobs too
        self.threads: list[threading.Thread] = []

    def start(self) -> Traffic:
        for i in range(self.clients):
            self.threads.append(threading.Thread(target=self._client, args=(i,), name=f"client-{i}", daemon=True))
        for i in range(self.bulk_clients if self.bulk else 0):
            self.threads.append(threading.Thread(target=self._bulk, args=(i,), name=f"bulk-{i}", daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def finish(self, timeout_s: float) -> bool:
        """Stop sending and wait (bounded) for every client; bulk jobs are polled to their end
        meanwhile. True if all ended."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.give_up.set()
        for thread in self.threads:
            thread.join(timeout=self.deadline_s + CLIENT_MARGIN_S + 5)
        return not any(t.is_alive() for t in self.threads)

    # -- interactive requests ---------------------------------------------------------------

    def _client(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        kinds, weights = zip(*self.KINDS)
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            if kind == "v1-image" and rng.random() > self.image_share:
                kind = "v1-text"
            deadline = self.deadline_s if rng.random() < 0.5 else rng.choice((3.0, 5.0, 8.0))
            self.requests.append(self._one(kind, deadline, rng))
            self.stop.wait(rng.uniform(0, 2 * self.pause_s))

    def _one(self, kind: str, deadline: float, rng: random.Random) -> Request:
        refs = self.refs
        headers = {"X-Request-Timeout": f"{deadline:g}"} if deadline != self.deadline_s else {}
        headers["X-Priority"] = rng.choice(("high", "normal", "normal", "low"))  # every lane under the faults
        request = Request(kind, time.time(), deadline)
        if kind == "hangup":
            text = rng.choice(refs.texts)
            self._hang_up(request, json.dumps({"text": text}).encode(), headers, rng.uniform(0.02, 0.3))
            return request
        if kind == "v1-text":
            text = rng.choice(refs.texts)
            path, body, ctype = f"/v1/models/{TEXT}/predict", json.dumps({"text": text}).encode(), "application/json"
        elif kind == "v1-texts":
            texts = rng.sample(refs.texts, rng.randint(2, 4))
            path, body, ctype = f"/v1/models/{TEXT}/predict", json.dumps({"texts": texts}).encode(), "application/json"
        elif kind == "v1-image":
            image = rng.randrange(len(refs.images))
            path, body, ctype = f"/v1/models/{IMAGE}/predict", refs.images[image], "image/jpeg"
        else:  # v2-text
            texts = rng.sample(refs.texts, rng.randint(1, 3))
            tensor = {"name": "TEXT", "shape": [len(texts)], "datatype": "BYTES", "data": texts}
            path, ctype = f"/v2/models/{TEXT}/infer", "application/json"
            body = json.dumps({"inputs": [tensor]}).encode()
        status, raw, outcome = call(self.port, "POST", path, body, {**headers, "Content-Type": ctype},
                                    deadline + CLIENT_MARGIN_S)
        request.ended, request.status, request.outcome = time.time(), status, outcome
        answer = _json(raw)
        if status == 200:
            if kind == "v1-text":
                request.correct = refs.text_ok(text, answer.get("embedding"))
            elif kind == "v1-texts":
                results = answer.get("results") or []
                request.correct = len(results) == len(texts) and all(
                    refs.text_ok(t, r.get("embedding")) for t, r in zip(texts, results))
            elif kind == "v1-image":
                request.correct = refs.image_ok(image, answer.get("predictions"))
            else:
                request.correct = self._v2_ok(texts, answer)
        elif status:
            request.error = error_of(answer)
        return request

    def _v2_ok(self, texts: list[str], answer: dict) -> bool:
        outputs = {o.get("name"): o for o in answer.get("outputs") or []}
        embedding = outputs.get("embedding")
        if not embedding or embedding.get("shape") != [len(texts), 384]:
            return False
        rows = np.asarray(embedding["data"], dtype=np.float32).reshape(len(texts), 384)
        return all(self.refs.text_ok(t, row) for t, row in zip(texts, rows))

    def _hang_up(self, request: Request, body: bytes, headers: dict, after_s: float) -> None:
        """Send a whole predict, then close the connection after_s later, before its answer
        (mostly: an answer that comes sooner is read and counted as hung_up all the same)."""
        head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Type": "application/json",
                                                   "Content-Length": str(len(body)), "Host": "127.0.0.1"}.items())
        request.outcome = "hung_up"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(f"POST /v1/models/{TEXT}/predict HTTP/1.1\r\n{head}\r\n".encode() + body)
                self.stop.wait(after_s)
        except OSError:
            request.outcome = "refused"
        request.ended = time.time()

    # -- bulk jobs --------------------------------------------------------------------------

    def _bulk(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + 500 + index)
        while not self.stop.is_set():
            if rng.random() < 0.3 * self.image_share:
                job = BulkJob(IMAGE, [rng.randrange(len(self.refs.images)) for _ in range(rng.randint(2, 4))],
                              time.time())
            else:
                job = BulkJob(TEXT, rng.sample(self.refs.texts, rng.randint(8, 32)), time.time())
            self.jobs.append(job)
            self._run_job(job)
            self.stop.wait(rng.uniform(0, 1.0))

    def _run_job(self, job: BulkJob) -> None:
        if job.model == TEXT:
            body, headers = json.dumps({"texts": job.items}).encode(), {"Content-Type": "application/json"}
        else:
            body, headers = multipart([self.refs.images[i] for i in job.items])
        status, raw, outcome = call(self.port, "POST", f"/v1/models/{job.model}/jobs", body, headers,
                                    self.deadline_s + CLIENT_MARGIN_S)
        job.submit_status = status
        if status != 202:
            job.state = f"not submitted ({outcome})"
            return
        job.job_id = _json(raw).get("id", "")
        until = time.monotonic() + self.job_timeout_s
        while not self.give_up.is_set() and time.monotonic() < until:
            status, raw, outcome = call(self.port, "GET", f"/v1/jobs/{job.job_id}?limit=0", None, {}, 10)
            job.polls[outcome] = job.polls.get(outcome, 0) + 1
            if status == 200:
                job.state = _json(raw).get("state", "")
                if job.state in ("done", "failed", "cancelled"):
                    job.finished = time.time()
                    self._read_results(job)
                    return
            elif status in (404, 410):
                job.state = "lost" if status == 404 else "expired"
                return
            self.give_up.wait(0.5)
        job.state = job.state + " (timeout)" if job.state else "timeout"

    def _read_results(self, job: BulkJob) -> None:
        for _ in range(20):  # a read may meet a fault too: try again a while
            status, raw, _ = call(self.port, "GET", f"/v1/jobs/{job.job_id}/results", None, {}, 20)
            if status == 200:
                break
            self.give_up.wait(0.5)
        else:
            job.state += " (results unread)"
            return
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        job.results = sum(line is not None for line in lines)
        job.missing = len(job.items) - job.results
        for item, result in zip(job.items, lines):
            if result is None:
                continue
            if "error" in result:
                job.failed_items += 1
            elif job.model == TEXT:
                job.wrong += not self.refs.text_ok(item, result.get("embedding"))
            else:
                job.wrong += not self.refs.image_ok(item, result.get("predictions"))
        job.wrong += max(0, len(lines) - len(job.items))  # more results than items: wrong too

"""A Python client for Funnel's HTTP API: the standard library only, safe to share between threads.

    from funnel_client import Client

    with Client("http://127.0.0.1:8000") as client:
        top5 = client.predict("image-classifier", image="cat.jpg")["predictions"]
        vector = client.predict("text-embedding", text="A man is eating food.")["embedding"]
        futures = [client.submit("text-embedding", text=t) for t in texts]
        vectors = [f.result()["embedding"] for f in futures]

Every call returns the server's decoded JSON. A 503 is retried (at most
`retries` times, waiting what its Retry-After header says, capped); any other
failure raises a `FunnelHTTPError` subclass carrying the HTTP status and the
server's error code and message.

Each thread keeps one keep-alive connection to the server; `submit` runs the
call on a thread pool inside the client and returns a
`concurrent.futures.Future`.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import hmac
import http.client
import json
import mimetypes
import os
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, Union

__all__ = ["Client", "FunnelHTTPError", "BadRequest", "Unauthorized", "NotFound", "ServerBusy",
           "Timeout", "ServerError", "ConnectionFailed", "error_for", "verify_webhook",
           "WebhookVerificationError"]

ImageInput = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", BinaryIO]
# A file for a `file` model: as an image is given, or a pair (that, its content type).
FileInput = Union[ImageInput, "tuple[ImageInput, str]"]
JOB_FINAL_STATES = ("done", "failed", "cancelled")
_NOTHING: Any = object()  # input= not given (None is a JSON value a model may take)


# -- errors ------------------------------------------------------------------


class FunnelHTTPError(Exception):
    """The server answered with an error, or could not be reached.

    status: the HTTP status (None when no HTTP answer came back)
    code: the server's stable error code (`empty_input`, `unknown_model`, ...)
    message: the server's message
    headers: the response headers (lower-case names)
    """

    def __init__(self, status: int | None, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(f"{status} {code}: {message}" if status is not None else f"{code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}

    def __reduce__(self):  # picklable, so it can cross process pools
        return (type(self), (self.status, self.code, self.message, self.headers))


class BadRequest(FunnelHTTPError):
    """400, 413, 415 or 422: the request itself is wrong; sending it again will not help."""


class Unauthorized(FunnelHTTPError):
    """401 or 403: the server has API keys and the request's is missing or wrong."""


class NotFound(FunnelHTTPError):
    """404: no such model (or route)."""


class ServerBusy(FunnelHTTPError):
    """503 after every retry: the model's queue is full or the server cannot reach Redis."""


class Timeout(FunnelHTTPError):
    """504 (no reply before the server's deadline), or no answer within the client's timeout (status None)."""


class ServerError(FunnelHTTPError):
    """Any other 5xx: inference failed, or the server broke."""


class ConnectionFailed(FunnelHTTPError):
    """The server could not be reached or dropped the connection (status None)."""


_BY_STATUS = {400: BadRequest, 413: BadRequest, 415: BadRequest, 422: BadRequest,
              401: Unauthorized, 403: Unauthorized, 404: NotFound, 503: ServerBusy, 504: Timeout}


def error_for(status: int, body: bytes, headers: dict[str, str] | None = None) -> FunnelHTTPError:
    """The typed error for an HTTP error answer, from its {"error": {"code", "message"}} body."""
    code, message = f"http_{status}", ""
    try:
        error = json.loads(body)["error"]
        code, message = str(error.get("code") or code), str(error.get("message") or "")
    except (ValueError, TypeError, KeyError, AttributeError):
        message = body[:500].decode("utf-8", errors="replace").strip()
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else FunnelHTTPError)
    return cls(status, code, message or http.client.responses.get(status, "error"), headers)


# -- webhooks ----------------------------------------------------------------


class WebhookVerificationError(ValueError):
    """A webhook delivery whose Funnel-Signature is missing, wrong or too old."""


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes,
                   tolerance_s: float = 300, now: float | None = None) -> dict[str, Any]:
    """The job status a Funnel webhook delivered, once its signature checks out.

    headers: the delivery's headers (any case); body: its raw bytes, exactly as received.
    `Funnel-Signature: t=<unix seconds>,v1=<hex>` must carry an HMAC-SHA256 of `<t>.<body>` under the
    shared secret (FUNNEL_WEBHOOK_SECRET), and t must be within tolerance_s of now (replays).
    Raises WebhookVerificationError otherwise.
    """
    given = {k.lower(): v for k, v in headers.items()}.get("funnel-signature", "")
    timestamp, macs = None, []
    for part in given.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            macs.append(value)
    if timestamp is None or not macs:
        raise WebhookVerificationError("no Funnel-Signature header of the form t=<unix>,v1=<hex>")
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        raise WebhookVerificationError(f"the signature's time is more than {tolerance_s:g} s away from now")
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + bytes(body), hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, mac) for mac in macs):
        raise WebhookVerificationError("the signature does not match the body and the secret")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise WebhookVerificationError(f"the body is not JSON: {exc}") from None


# -- inputs ------------------------------------------------------------------

_MAGIC = [(b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF87a", "image/gif"),
          (b"GIF89a", "image/gif"), (b"BM", "image/bmp"), (b"II*\x00", "image/tiff"),
          (b"MM\x00*", "image/tiff")]


def guess_image_type(data: bytes, name: str | None = None) -> str:
    """The image/* content type of these bytes (by their magic number, then by file name)."""
    head = bytes(data[:16])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    guessed = mimetypes.guess_type(name)[0] if name else None
    if guessed and guessed.startswith("image/"):
        return guessed
    return "application/octet-stream"  # the server reads it as an image all the same


def _read(source: ImageInput, what: str) -> tuple[bytes, str | None]:
    """The bytes of a file given as bytes, a path, or a binary file-like object, and its name if known."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    if isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        with open(name, "rb") as handle:
            return handle.read(), name
    if hasattr(source, "read"):
        data = source.read()
        if isinstance(data, str):
            raise TypeError(f"open the {what} file in binary mode ('rb')")
        name = getattr(source, "name", None)
        return data, name if isinstance(name, str) else None
    raise TypeError(f"{what} must be bytes, a path or a binary file object, not {type(source).__name__}")


def read_image(image: ImageInput) -> tuple[bytes, str]:
    """(bytes, content type) of an image given as bytes, a path, or a binary file-like object."""
    data, name = _read(image, "image")
    return data, guess_image_type(data, name)


def read_file(file: FileInput) -> tuple[bytes, str]:
    """(bytes, content type) of a file for a `file` model: bytes, a path or a binary file-like object
    (its type guessed from its name, a WAV's or an image's from its first bytes), or a pair
    (any of those, content type) that names its type."""
    if isinstance(file, tuple):
        source, content_type = file
        return _read(source, "file")[0], content_type
    data, name = _read(file, "file")
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return data, "audio/wav"
    guessed = mimetypes.guess_type(name)[0] if name else None
    return data, guessed or guess_image_type(data)


def _json_lines(response: http.client.HTTPResponse) -> Iterator[Any]:
    """The values of a JSON Lines body as it arrives. read1, not line iteration: iterating lines ends
    quietly where a chunked stream was cut short (Redis or the server gone mid-way), read1 raises."""
    rest = b""
    while True:
        chunk = response.read1(1 << 16)
        if not chunk:
            break
        *lines, rest = (rest + chunk).split(b"\n")
        yield from (json.loads(line) for line in lines if line.strip())
    if response.length:  # a Content-Length body that ended early
        raise http.client.IncompleteRead(rest, response.length)
    if rest.strip():
        yield json.loads(rest)


def _multipart(files: list[tuple[bytes, str]], fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart/form-data body: one `file` part per (bytes, content type), then the text fields."""
    boundary = f"funnel-{uuid.uuid4().hex}"
    parts = []
    for i, (data, content_type) in enumerate(files):
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{i}"\r\n'
                     f"Content-Type: {content_type}\r\n\r\n".encode() + data + b"\r\n")
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# -- the client --------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _retry_after_s(value: str | None, default: float) -> float:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - time.time()) if when is not None else default


class Client:
    """Funnel over HTTP. Thread-safe: share one client between threads.

    url: the server, e.g. http://127.0.0.1:8000 (a path prefix is kept)
    api_key: sent as `Authorization: Bearer <key>` when the server has API keys
    timeout: seconds the socket may wait, to connect or for the answer's next bytes
    retries: times a 503 is tried again, each after its Retry-After (capped at max_retry_wait_s)
    workers: threads of the pool that runs `submit` (started on the first submit)
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 timeout: float = 60, retries: int = 3, *, workers: int = 8,
                 max_retry_wait_s: float = 10.0):
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._base_path = parts.path.rstrip("/")
        self.api_key, self.timeout, self.retries = api_key, timeout, max(0, int(retries))
        self.max_retry_wait_s = max_retry_wait_s
        self.workers = workers
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- the API -------------------------------------------------------------

    def predict(self, model: str, image: ImageInput | None = None, *, text: str | None = None,
                texts: Iterable[str] | None = None, input: Any = _NOTHING,
                inputs: Iterable[Any] | None = None, file: FileInput | None = None,
                files: Iterable[FileInput] | None = None) -> dict[str, Any]:
        """One prediction: exactly one of image= (bytes, path or binary file), text=, texts=, input=,
        inputs=, file= or files=.

        Which one a model takes is its `input_kind` in GET /v1/models: "image",
        "text" (text= or texts=), "json" (input= one JSON value, inputs= a list), or "file" (file=
        one, files= several; each bytes, a path, a binary file, or a (file, content type) pair: the
        model's `content_types` say which it takes).
        Returns the server's JSON: the result's fields at the top level with "meta"
        for one item ({"model", "predictions", "meta"} for an image,
        {"model", "embedding", "meta"} for a text), {"model", "results", "meta"} for many.
        """
        chosen = {name: value for name, value in (("image", image), ("text", text), ("texts", texts),
                                                  ("inputs", inputs), ("file", file), ("files", files))
                  if value is not None}
        if input is not _NOTHING:
            chosen["input"] = input
        if len(chosen) != 1:
            raise ValueError(f"give exactly one of image=, text=, texts=, input=, inputs=, file= or files= "
                             f"(got {', '.join(chosen) or 'none'})")
        ((name, value),) = chosen.items()
        if name == "image":
            body, content_type = read_image(value)
        elif name == "file":
            body, content_type = read_file(value)
        elif name == "files":
            if isinstance(value, (str, bytes, tuple)):
                raise TypeError("files= takes a list; use file= for one")
            body, content_type = _multipart([read_file(f) for f in value], {})
        else:
            if name in ("texts", "inputs"):
                if isinstance(value, (str, bytes)):
                    raise TypeError(f"{name}= takes a list; use {name[:-1]}= for one")
                value = list(value)
            body, content_type = json.dumps({name: value}).encode(), "application/json"
        path = f"/v1/models/{urllib.parse.quote(model, safe='')}/predict"
        return self._call("POST", path, body, content_type)

    def stream(self, model: str, texts: Iterable[str] | None = None, *,
               inputs: Iterable[Any] | None = None) -> Iterator[dict[str, Any]]:
        """A predict of many texts or JSON inputs, answered as its items are (Server-Sent Events): each
        item's result as it comes, with its "index" in the request and its "meta", in whatever order they
        finish; an item whose batch failed as {"index", "error"}. The request's own error raises, as
        predict's does."""
        given = [(name, list(value)) for name, value in (("texts", texts), ("inputs", inputs)) if value is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of texts= or inputs=")
        path = f"/v1/models/{urllib.parse.quote(model, safe='')}/predict"
        for name, data in self._events("POST", path, json.dumps(dict(given)).encode()):
            if name == "item":
                yield data
            elif name == "error":
                status = data.pop("status", 500)
                raise error_for(status, json.dumps(data).encode(), {})

    def submit(self, model: str, image: ImageInput | None = None, *, text: str | None = None,
               texts: Iterable[str] | None = None, input: Any = _NOTHING,
               inputs: Iterable[Any] | None = None, file: FileInput | None = None,
               files: Iterable[FileInput] | None = None) -> Future[dict[str, Any]]:
        """`predict` on the client's thread pool: a Future of its result (or of its error)."""
        if image is not None and hasattr(image, "read"):
            image = read_image(image)[0]  # read now, on the caller's thread
        if file is not None:
            file = read_file(file)  # read now, on the caller's thread
        if files is not None:
            files = [read_file(f) for f in files]
        if texts is not None and not isinstance(texts, (str, bytes)):
            texts = list(texts)
        if inputs is not None and not isinstance(inputs, (str, bytes)):
            inputs = list(inputs)
        return self._executor().submit(self.predict, model, image, text=text, texts=texts,
                                       input=input, inputs=inputs, file=file, files=files)

    # -- async and bulk jobs (docs/jobs.md) -----------------------------------

    def submit_job(self, model: str, texts: Iterable[str] | None = None, *, inputs: Iterable[Any] | None = None,
                   images: Iterable[ImageInput] | None = None, files: Iterable[FileInput] | None = None,
                   idempotency_key: str | None = None, webhook: str | None = None) -> dict[str, Any]:
        """POST /v1/models/<model>/jobs: queue many texts, JSON inputs, images or files (each bytes, a
        path or a binary file; a file also a (file, content type) pair) as one job; its status, with "id".

        An Idempotency-Key (a fresh random one unless given) makes the client's own
        retries after a 503 safe: the server answers the job the first try made.
        webhook: a URL the server POSTs the job's status to when it is final (check it with
        `verify_webhook`).
        """
        given = [(name, value) for name, value in (("texts", texts), ("inputs", inputs), ("images", images),
                                                   ("files", files)) if value is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of texts=, inputs=, images= or files=")
        ((name, value),) = given
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name}= takes a list")
        if name in ("images", "files"):
            read = read_image if name == "images" else read_file
            body, content_type = _multipart([read(one) for one in value],
                                            {"webhook": webhook} if webhook is not None else {})
        else:
            fields: dict[str, Any] = {name: list(value)}
            if webhook is not None:
                fields["webhook"] = webhook
            body, content_type = json.dumps(fields).encode(), "application/json"
        key = idempotency_key or uuid.uuid4().hex
        return self._call("POST", f"/v1/models/{urllib.parse.quote(model, safe='')}/jobs", body,
                          content_type, accept=(202,), headers={"Idempotency-Key": key})

    def job_status(self, job_id: str, offset: int = 0, limit: int = 0) -> dict[str, Any]:
        """GET /v1/jobs/<id>: {"state", "progress": {done, total, failed}, ...}, with a page of
        results when limit > 0. A job past its TTL raises FunnelHTTPError with status 410."""
        query = urllib.parse.urlencode({"offset": offset, "limit": limit})
        return self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}?{query}")

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 0.5,
             progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job is done, failed or cancelled; its final status. progress(status) after
        each poll. Raises Timeout (status None) after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.job_status(job_id)
            if progress:
                progress(status)
            if status["state"] in JOB_FINAL_STATES:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise Timeout(None, "client_timeout", f"job {job_id} not finished within {timeout} s")
            time.sleep(poll_s)

    def results(self, job_id: str, page: int = 1000, poll_s: float = 0.5) -> Iterator[dict[str, Any] | None]:
        """Every result of the job in input order, as it arrives: each as predict answers one item,
        {"error": {...}} for a failed item; None for an item a cancel stopped. Pages while the job
        runs; once it is final, the rest comes in one JSON Lines stream (`stream_results`)."""
        offset = 0
        while True:
            status = self.job_status(job_id, offset, page)
            if status["state"] in JOB_FINAL_STATES:
                yield from self.stream_results(job_id, offset)
                return
            results = status["results"]
            ready = len(results) if None not in results else results.index(None)
            yield from results[:ready]
            offset += ready
            if ready < len(results):
                if status["state"] in JOB_FINAL_STATES:  # cancelled: what never ran stays None
                    yield None
                    offset += 1
                else:
                    time.sleep(poll_s)
                continue
            if status["next_offset"] is None:
                return

    def stream_results(self, job_id: str, offset: int = 0) -> Iterator[dict[str, Any] | None]:
        """GET /v1/jobs/<id>/results: every result from offset on, in input order, read from the server's
        JSON Lines stream as it comes (None for an item not answered yet), on a connection of its own."""
        path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/results?offset={int(offset)}"
        for attempt in range(self.retries + 1):
            with self._streaming("results") as connection:
                connection.request("GET", self._base_path + path,
                                   headers=self._headers(None, {"Accept": "application/x-ndjson"}))
                response = connection.getresponse()
                if response.status == 200:
                    yield from _json_lines(response)
                    return
                data, headers = response.read(), {k.lower(): v for k, v in response.getheaders()}
            if response.status == 503 and attempt < self.retries:
                time.sleep(min(self.max_retry_wait_s, _retry_after_s(headers.get("retry-after"), 1.0)))
                continue
            raise error_for(response.status, data, headers)

    def events(self, job_id: str, offset: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """GET /v1/jobs/<id>/events: the job's Server-Sent Events as they come, ("progress", its status),
        ("page", {"offset", "results"}) and last ("done", its final status); a stream the server ends, or
        that breaks off, is resumed from the last event's id (Last-Event-ID)."""
        path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/events"
        resume = str(int(offset))
        for _ in range(1000):  # a server's streams end after minutes; a job of hours resumes that often
            try:
                for name, data, event_id in self._events("GET", path, None, {"Last-Event-ID": resume}, ids=True):
                    resume = event_id or resume
                    yield name, data
                    if name == "done":
                        return
            except ConnectionFailed:
                time.sleep(min(self.max_retry_wait_s, 1.0))

    def _events(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None,
                ids: bool = False) -> Iterator[Any]:
        """The Server-Sent Events of one request, on a connection of its own: (name, data), with the
        event's id too when `ids`; an answer that is not a stream raises its error."""
        with self._streaming("event") as connection:
            connection.request(method, self._base_path + path, body=body, headers=self._headers(
                "application/json" if body is not None else None, {"Accept": "text/event-stream", **(headers or {})}))
            response = connection.getresponse()
            if response.status != 200 or not (response.getheader("Content-Type") or "").startswith(
                    "text/event-stream"):
                raise error_for(response.status, response.read(), {k.lower(): v for k, v in response.getheaders()})
            name, event_id, data = "message", "", []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        parsed = json.loads("\n".join(data))
                        yield (name, parsed, event_id) if ids else (name, parsed)
                    name, data = "message", []
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())

    @contextlib.contextmanager
    def _streaming(self, what: str) -> Iterator[http.client.HTTPConnection]:
        """A connection of its own for a stream, closed after; its failures as the client's errors."""
        connection = self._new_connection()
        try:
            yield connection
        except TimeoutError as exc:
            raise Timeout(None, "client_timeout", f"no answer from {self.url} within {self.timeout} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionFailed(None, "connection_failed",
                                   f"{self.url}: the {what} stream broke off: {_describe(exc)}") from exc
        finally:
            connection.close()

    def cancel(self, job_id: str) -> dict[str, Any]:
        """DELETE /v1/jobs/<id>: items not yet taken never run; the job's status after."""
        return self._call("DELETE", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}")

    def models(self) -> dict[str, Any]:
        """GET /v1/models: {"models": [{name, task, batch_size, queue, workers, ...}]}."""
        return self._call("GET", "/v1/models")

    def health(self) -> dict[str, Any]:
        """GET /healthz: {"status": "ok", ...}; a 503's body ({"status": "unavailable", ...}) is returned too.

        Not retried: a 503 here is the answer ("not healthy"), not a busy queue. Open without an API key.
        """
        return self._call("GET", "/healthz", retries=0, accept=(200, 503))

    def openapi(self) -> dict[str, Any]:
        """GET /openapi.json: the API's OpenAPI 3 document."""
        return self._call("GET", "/openapi.json")

    def close(self) -> None:
        """Stop the thread pool (after the calls it holds) and close every connection."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        if self._closed:
            raise RuntimeError("the client is closed")
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="funnel-client")
            return self._pool

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        """This thread's keep-alive connection (a new one when asked, or the first time)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None and not fresh:
            return connection
        if connection is not None:
            connection.close()
        connection = self._new_connection()
        self._local.connection = connection
        with self._lock:
            self._connections.add(connection)
        return connection

    def _new_connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout)

    def _headers(self, content_type: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "funnel-client/1", **(extra or {})}
        if content_type:
            headers["Content-Type"] = content_type
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _send(self, method: str, path: str, body: bytes | None, content_type: str | None,
              extra_headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        """One HTTP exchange on this thread's connection: (status, body, lower-case headers)."""
        headers = self._headers(content_type, extra_headers)
        for attempt in range(2):
            # A kept-alive connection the server has closed fails on first use: retry once on a new one.
            connection = self._connection(fresh=attempt > 0)
            reused = connection.sock is not None
            try:
                connection.request(method, self._base_path + path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except TimeoutError as exc:
                connection.close()
                raise Timeout(None, "client_timeout",
                              f"no answer from {self.url} within {self.timeout} s") from exc
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    http.client.BadStatusLine) as exc:
                connection.close()
                if reused:
                    continue
                raise ConnectionFailed(None, "connection_failed", f"{self.url}: {_describe(exc)}") from exc
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise ConnectionFailed(None, "connection_failed", f"{self.url}: {_describe(exc)}") from exc
            response_headers = {k.lower(): v for k, v in response.getheaders()}
            if response.will_close:
                connection.close()
            return response.status, data, response_headers
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
              *, retries: int | None = None, accept: tuple[int, ...] = (200,),
              headers: dict[str, str] | None = None) -> dict[str, Any]:
        retries = self.retries if retries is None else retries
        extra = headers
        for attempt in range(retries + 1):
            status, data, headers = self._send(method, path, body, content_type, extra)
            if status in accept:
                try:
                    return json.loads(data)
                except ValueError as exc:
                    raise ServerError(status, "bad_response", f"the answer is not JSON: {data[:200]!r}",
                                      headers) from exc
            if status == 503 and attempt < retries:
                default = min(self.max_retry_wait_s, 0.25 * 2 ** attempt)
                time.sleep(min(self.max_retry_wait_s, _retry_after_s(headers.get("retry-after"), default)))
                continue
            raise error_for(status, data, headers)
        raise AssertionError("unreachable")

"""Delivering job webhooks: a background thread in every worker process.

Due deliveries wait in one sorted set, funnel:webhooks (job id scored by when
it is due), put there by the step that made the job final (common/lua/'s
store_results.lua or cancel.lua). A deliverer claims the oldest due one with a
Lua script (common/lua/webhook_claim.lua) that pushes its score a lease ahead
(4 x FUNNEL_WEBHOOK_TIMEOUT_S) and counts the attempt, so a deliverer that
dies mid-attempt hands it back when the lease runs out; it then POSTs the
job's status, signed, and settles the attempt (delivered, due again after a
backoff, or failed after FUNNEL_WEBHOOK_ATTEMPTS) only if its claim still
stands. Delivery is at least once: a receiver drops repeats by the
Funnel-Webhook-Id header.

One attempt: the URL is checked again and its name resolved now (an address
checked at submit may since have been rebound to a private one), the
connection goes to an address that passed, no redirect is followed, and
nothing past the answer's status line is read.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import ssl
import threading
import time
import uuid

import redis

from funnel.common import lua_scripts, webhooks
from funnel.common.jobs import Record
from funnel.common.keys import Keys
from funnel.common.wire import now_ms
from funnel.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

POLL_S = 0.5              # how often an idle deliverer looks for due deliveries
MAX_ANSWER_BYTES = 4096   # read at most this much of a receiver's answer, for its status line
LEASE_FACTOR = 4          # a claim lasts this many attempt timeouts (DNS is not under our timeout)
MAX_ERROR_CHARS = 300

class DeliveryFailed(Exception):
    """One attempt did not get a 2xx: status is the HTTP status when one came back, else 0."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def post(url: str, body: bytes, headers: dict[str, str], allow: list[str], timeout_s: float) -> int:
    """POST body to url, as described above; the answer's status when it is 2xx, else DeliveryFailed."""
    try:
        dest = webhooks.parse(url)
        addresses = webhooks.resolve(dest, allow)
    except webhooks.Refused as exc:
        raise DeliveryFailed(f"refused: {exc}") from None
    deadline = time.monotonic() + timeout_s
    head = [f"POST {dest.target} HTTP/1.1", f"Host: {dest.netloc}", "User-Agent: funnel-webhook/1",
            "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close",
            *(f"{name}: {value}" for name, value in headers.items())]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    try:
        sock = socket.create_connection((addresses[0], dest.port), timeout=timeout_s)
    except OSError as exc:
        raise DeliveryFailed(f"could not connect to {addresses[0]} port {dest.port}: {exc}") from None
    try:
        if dest.scheme == "https":
            _remaining(sock, deadline)
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=dest.host)
        _remaining(sock, deadline)
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer and len(answer) < MAX_ANSWER_BYTES:
            _remaining(sock, deadline)
            chunk = sock.recv(MAX_ANSWER_BYTES - len(answer))
            if not chunk:
                break
            answer += chunk
    except TimeoutError:
        raise DeliveryFailed(f"no answer within {timeout_s:g} s") from None
    except OSError as exc:  # ssl.SSLError included
        raise DeliveryFailed(f"connection failed: {exc}") from None
    finally:
        sock.close()
    status = _status(answer)
    if not 200 <= status < 300:
        raise DeliveryFailed(f"answered HTTP {status}" if status else "no HTTP answer", status)
    return status


def _remaining(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)


def _status(answer: bytes) -> int:
    """The status code of an HTTP/1.x status line, else 0."""
    parts = answer.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1].isdigit() and len(parts[1]) == 3:
        return int(parts[1])
    return 0


def backoff_ms(attempts: int, first_s: float) -> int:
    """Wait after the attempts-th failed attempt: first_s, doubling, plus up to a tenth of jitter."""
    wait = first_s * 2 ** (attempts - 1)
    return int(wait * (1 + random.random() / 10) * 1000)


class Deliverer:
    def __init__(self, client: redis.Redis, keys: Keys, settings: WorkerSettings):
        self.client, self.keys, self.settings = client, keys, settings
        self.lease_ms = int(LEASE_FACTOR * settings.webhook_timeout_s * 1000)
        self._claim = lua_scripts.register(client, "webhook_claim")
        self._settle = lua_scripts.register(client, "webhook_settle")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)

    def start(self) -> Deliverer:
        if not self.keys.cluster:  # no job is made on a cluster (common/job_store.py, 501): nothing to deliver
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the attempt in hand (at most one timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.settings.webhook_timeout_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                while not self._stop.is_set() and self.deliver_one():
                    pass
            except redis.RedisError as exc:
                log.warning("webhook deliveries paused: %s", exc)

    def deliver_one(self) -> bool:
        """Claim the oldest due delivery and attempt it; False when none is due."""
        token = f"{self.settings.worker_id} {uuid.uuid4().hex[:12]}"
        claimed = self._claim(keys=[self.keys.webhooks_due()],
                              args=[now_ms(), self.lease_ms, token, self.keys.job_prefix(),
                                    self.settings.webhook_attempts])
        if not claimed:
            return False
        job_id, flat = claimed[0].decode(), claimed[1]
        record = Record.parse(job_id, dict(zip(flat[::2], flat[1::2])))
        status, error = 0, ""
        try:
            status = self.attempt(record)
            outcome, due = "delivered", 0
        except DeliveryFailed as exc:
            status, error = exc.status, str(exc)[:MAX_ERROR_CHARS]
            last = record.webhook_attempts >= self.settings.webhook_attempts
            outcome = "failed" if last else "retry"
            due = 0 if last else now_ms() + backoff_ms(record.webhook_attempts, self.settings.webhook_backoff_s)
            log.info("webhook for job %s, attempt %d: %s", job_id, record.webhook_attempts, error)
        self._settle(keys=[self.keys.webhooks_due(), self.keys.job(job_id)],
                     args=[job_id, token, outcome, status, error, due])
        return True

    def attempt(self, record: Record) -> int:
        if not self.settings.webhook_secret:
            raise DeliveryFailed("this worker has no FUNNEL_WEBHOOK_SECRET to sign with")
        body = json.dumps(record.status(webhook=False), separators=(",", ":")).encode()
        headers = {webhooks.SIGNATURE_HEADER: webhooks.signature(self.settings.webhook_secret, body, int(time.time())),
                   webhooks.ID_HEADER: record.id, "Funnel-Webhook-Attempt": str(record.webhook_attempts)}
        return post(record.webhook_url, body, headers, self.settings.webhook_allow_hosts,
                    self.settings.webhook_timeout_s)

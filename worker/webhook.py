"""Delivering job webhooks: a background thread in every worker process.

Due deliveries wait in one sorted set, funnel:webhooks (job id scored by when
it is due), put there by the step that made the job final (common/link/lua/'s
store_results.lua or cancel.lua; on a Redis Cluster by its caller just after,
common/bulk/jobs.py's mark_due). The job's record holds the delivery's state and is
what decides; the due set is its index. A deliverer claims in two steps, each a
Lua script on keys of one slot, since on a cluster the due set and a job's
record are in different slots (and the same two steps on a single Redis: one
way everywhere): it leases the oldest due entry (webhook_lease.lua: its score
pushed a lease ahead, 4 x FUNNEL_WEBHOOK_TIMEOUT_S, so a deliverer that dies
hands it back when the lease runs out), then claims it on the record
(webhook_claim.lua: the attempt counted, a claim token recorded; an entry
whose delivery is over is dropped, one whose retry is not yet due put back at
its time). It POSTs the job's status, signed, and settles the attempt on the
record (webhook_settle.lua: delivered, due again after a backoff, or failed
after FUNNEL_WEBHOOK_ATTEMPTS) only if its claim still stands, then scores the
entry by the outcome. A deliverer that dies between two steps leaves an entry
the next claim mends. Delivery is at least once: a receiver drops repeats by
the Funnel-Webhook-Id header.

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

from funnel.common.bulk import webhooks
from funnel.common.bulk.jobs import Record
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import now_ms
from funnel.common.link import lua_scripts
from funnel.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

POLL_S = 0.5              # how often an idle deliverer looks for due deliveries
MAX_ANSWER_BYTES = 4096   # read at most this much of a receiver's answer, for its status line
LEASE_FACTOR = 4          # a claim lasts this many attempt timeouts (DNS is not under our timeout)
MAX_ERROR_CHARS = 300
MAX_SKIPPED = 100         # due entries of finished or not-yet-due deliveries mended per look
CLAIMED, LATER = 1, 2     # webhook_claim.lua's answers: {1, fields}, {2, when}; else {0}, over

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
        self._lease = lua_scripts.register(client, "webhook_lease")
        self._claim = lua_scripts.register(client, "webhook_claim")
        self._settle = lua_scripts.register(client, "webhook_settle")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)

    def start(self) -> Deliverer:
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

    def claim(self, token: str) -> Record | None:
        """Lease the oldest due delivery and claim it under `token`: its job's record (the attempt
        counted), or None when none is due. Due entries whose delivery is over are dropped on the
        way, those not due yet scored at their time (MAX_SKIPPED of them at most)."""
        due = self.keys.webhooks_due()
        for _ in range(MAX_SKIPPED):
            leased = self._lease(keys=[due], args=[now_ms(), self.lease_ms])
            if not leased:
                return None
            job_id = leased.decode()
            answer = self._claim(keys=[self.keys.job(job_id)], args=[now_ms(), token, self.settings.webhook_attempts])
            if answer[0] == CLAIMED:
                flat = answer[1]
                return Record.parse(job_id, dict(zip(flat[::2], flat[1::2])))
            if answer[0] == LATER:  # a retry not due yet (its settle's score was lost): back at its time
                self.client.zadd(due, {job_id: int(answer[1])}, xx=True)
            else:  # delivered, failed, expired: nothing left to deliver
                self.client.zrem(due, job_id)
        return None

    def settle(self, record: Record, token: str, outcome: str, status: int, error: str, due_ms: int) -> bool:
        """Settle a claimed attempt on its record if the claim still stands (delivered, retry at
        due_ms, or failed), then score its due entry so: False when the claim no longer stands."""
        settled = self._settle(keys=[self.keys.job(record.id)], args=[token, outcome, status, error, due_ms])
        if settled:
            due = self.keys.webhooks_due()
            if outcome == "retry":
                self.client.zadd(due, {record.id: due_ms})
            else:
                self.client.zrem(due, record.id)
        return bool(settled)

    def deliver_one(self) -> bool:
        """Claim the oldest due delivery and attempt it; False when none is due."""
        token = f"{self.settings.worker_id} {uuid.uuid4().hex[:12]}"
        record = self.claim(token)
        if record is None:
            return False
        job_id = record.id
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
        self.settle(record, token, outcome, status, error, due)
        return True

    def attempt(self, record: Record) -> int:
        if not self.settings.webhook_secret:
            raise DeliveryFailed("this worker has no FUNNEL_WEBHOOK_SECRET to sign with")
        body = json.dumps(record.status(webhook=False), separators=(",", ":")).encode()
        headers = {webhooks.SIGNATURE_HEADER: webhooks.signature(self.settings.webhook_secret, body, int(time.time())),
                   webhooks.ID_HEADER: record.id, "Funnel-Webhook-Attempt": str(record.webhook_attempts)}
        return post(record.webhook_url, body, headers, self.settings.webhook_allow_hosts,
                    self.settings.webhook_timeout_s)

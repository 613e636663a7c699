"""A job's submit once its request is parsed: check, preprocess every item, create.

One plain function, submit(), with explicit arguments and no web framework, so
whatever reads the request (web/jobs.py's routes, or a request pipeline)
hands it the items, the raw body and the headers' values and renders the
record it returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from funnel.common import jobs, webhooks
from funnel.common.errors import BadInput, FunnelError
from funnel.common.job_store import JobStore
from funnel.common.tasks import Task
from funnel.common.wire import now_ms

MAX_IDEMPOTENCY_KEY = 255
WEBHOOK_HEADER = "Webhook-URL"


@dataclass(frozen=True)
class SubmitLimits:
    """What a submit is held to, from the web tier's settings."""

    max_bulk_queue: int
    webhook_secret: str = ""  # none: webhooks are off, and a submit naming one is refused
    webhook_allow_hosts: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, settings: Any) -> SubmitLimits:
        """From settings that carry these fields by name (web/settings.py's WebSettings)."""
        return cls(settings.max_bulk_queue, settings.webhook_secret, list(settings.webhook_allow_hosts))


def submit(store: JobStore, task: Task, model: str, items: list[Any], limits: SubmitLimits,
           idempotency_key: str | None, webhook: str | None, body: bytes) -> tuple[jobs.Record, bool]:
    """Make a job of these items: (its record, whether it is the job an earlier submit with this
    Idempotency-Key made). `body` is the request's raw body, what a retried submit must repeat.

    Raises BadInput for a bad key, webhook or item (named by its index), Overloaded when the bulk
    queue has no room, Conflict for a key reused with another body, OnCluster on a cluster.
    """
    store.usable()
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        raise BadInput(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                       code="bad_idempotency_key")
    if webhook is not None:
        check_webhook(webhook, limits)
    body_sha = fingerprint(body, webhook)
    if idempotency_key is not None:  # before any preprocessing: a retry costs a lookup only
        existing = store.replay(model, idempotency_key, body_sha)
        if existing is not None:
            return existing, True
    created = now_ms()
    job_id = jobs.new_job_id(created)
    payloads = store.item_payloads(job_id, model, created, preprocess(task, items))
    store.check_room(model, len(payloads), limits.max_bulk_queue)
    return store.create(job_id, model, created, payloads, body_sha, webhook, idempotency_key)


def check_webhook(url: str, limits: SubmitLimits) -> None:
    """BadInput (400) unless webhooks are on and this URL may be delivered to (common/webhooks.py)."""
    if not limits.webhook_secret:
        raise BadInput("this server sends no webhooks (FUNNEL_WEBHOOK_SECRET is not set)",
                       code="webhooks_disabled")
    try:
        webhooks.check(url, limits.webhook_allow_hosts)
    except webhooks.Refused as exc:
        raise BadInput(str(exc), code="bad_webhook") from None


def fingerprint(body: bytes, webhook: str | None) -> str:
    """What an Idempotency-Key's retry must repeat: the body, and the webhook wherever it was given."""
    if webhook is not None:
        body += f"\n{WEBHOOK_HEADER}: {webhook}".encode()
    return hashlib.sha256(body).hexdigest()


def preprocess(task: Task, items: list[Any]) -> Iterator[dict]:
    """Each item's tensors, in turn; a bad item fails the whole submit, named by its index."""
    for i, item in enumerate(items):
        try:
            yield task.preprocess(item)
        except FunnelError as exc:
            if len(items) > 1:
                exc.message = f"item {i}: {exc.message}"
                exc.args = (exc.message,)
            raise

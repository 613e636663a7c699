"""What a job's submit is checked for before its items are: the Idempotency-Key, the webhook.

The submit itself is web/pipeline.py's submit_job: the same resolve and
prepare steps as a predict, then the job store (common/bulk/job_store.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from funnel.common.bulk import webhooks
from funnel.common.errors import BadInput

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


def check(idempotency_key: str | None, webhook: str | None, limits: SubmitLimits) -> None:
    """BadInput (400) for an Idempotency-Key of the wrong length or a webhook that may not be sent."""
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        raise BadInput(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                       code="bad_idempotency_key")
    if webhook is not None:
        check_webhook(webhook, limits)


def check_webhook(url: str, limits: SubmitLimits) -> None:
    """BadInput (400) unless webhooks are on and this URL may be delivered to (common/bulk/webhooks.py)."""
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

"""Errors a client can be told about: an HTTP status, a stable code, a message."""

from __future__ import annotations


class FunnelError(Exception):
    status = 400
    code = "bad_request"
    retry_after: int | None = None  # seconds, for a 429's or 503's Retry-After (1 when not given)

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        if retry_after is not None:
            self.retry_after = retry_after

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class BadInput(FunnelError):
    status, code = 400, "bad_input"


class UnsupportedMediaType(FunnelError):
    status, code = 415, "unsupported_media_type"


class NotFound(FunnelError):
    status, code = 404, "not_found"


class TooManyRequests(FunnelError):
    """An API key past its own limits (web/queueing/limits.py); retry_after says when it may go on."""

    status, code = 429, "rate_limited"


class Overloaded(FunnelError):
    status, code = 503, "overloaded"


class Unavailable(FunnelError):
    status, code = 503, "unavailable"


def queue_unavailable(error: Exception) -> Unavailable:
    """What a request is answered when Redis fails under it: 503, naming the failure's kind."""
    return Unavailable(f"queue unavailable: {type(error).__name__}")


class NotReplicated(Unavailable):
    """A job the Redis primary took but fewer replicas than FUNNEL_JOB_REPLICAS held in time: refused,
    since a failover could lose it, and undone (common/bulk/job_store.py, web/queueing/outbox.py)."""

    code, retry_after = "not_replicated", 1


class NoWorker(Unavailable):
    """No live worker serves the model version; a worker starting loads its model in a few seconds."""

    code, retry_after = "no_worker", 5

    def __init__(self, model: str, version: int):
        super().__init__(f"no live worker serves {model} version {version}; retry when one has started")


class ModelUnavailable(Unavailable):
    """Every live worker of the model version failed to load it (a missing file, memory run out, a load
    past FUNNEL_LOAD_TIMEOUT_S); they try again after FUNNEL_LOAD_RETRY_S."""

    code, retry_after = "model_unavailable", 30

    def __init__(self, model: str, version: int, why: str):
        super().__init__(f"{model} version {version} could not be loaded: {why}")


class Timeout(FunnelError):
    status, code = 504, "timeout"


class InferenceFailed(FunnelError):
    status, code = 500, "inference_failed"


# Error codes a worker may put in a reply, and the HTTP status each becomes (a reply may name its
# own: a task's exception in `predict`, common/tasks/base.py).
REPLY_STATUS = {"bad_input": 400, "deadline_exceeded": 504, "too_many_attempts": 500,
                "inference_failed": 500, "bad_job": 500, "model_unavailable": 503, "predict_timeout": 504}


def reply_status(error: dict) -> int:
    """The HTTP status of a worker's error reply: the one it names (400-599), else its code's."""
    status = error.get("status")
    if type(status) is int and 400 <= status <= 599:
        return status
    return REPLY_STATUS.get(error.get("code", ""), 500)

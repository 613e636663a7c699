"""Log lines of both tiers: text, or one JSON object per line (FUNNEL_LOG_FORMAT=json), each naming
the request it is about.

A request's id (its X-Request-ID, or one made up: `request_id_of`) is set in
REQUEST_ID, a context variable, while the web tier works on the request (each
request is a task of its own, with its own copy), and by a worker around the
lines about one job. A filter on the handler copies it into every record as
`request_id`; both formats write it when set.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from contextvars import ContextVar

FORMATS = ("text", "json")
REQUEST_ID: ContextVar[str] = ContextVar("funnel_request_id", default="")
# What a client's X-Request-ID may be: printable, no spaces, bounded; anything else is replaced.
ACCEPTED_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def request_id_of(given: str | None) -> str:
    """The client's X-Request-ID when it is an acceptable one, else a new random id."""
    if given and ACCEPTED_ID.match(given):
        return given
    return os.urandom(8).hex()


class RequestIdFilter(logging.Filter):
    """Gives every record the request id of the context it was logged in (unless it names one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", "")
        return f"{line} request_id={request_id}" if request_id else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request_id when set,
    the exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}
        request_id = getattr(record, "request_id", "")
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}; one of {', '.join(FORMATS)}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(level: str, fmt: str = "text") -> None:
    """The root logger of this process: one stderr handler, the format chosen, request ids on."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def gunicorn_config(level: str, fmt: str) -> dict:
    """gunicorn's logconfig_dict: its own lines (the arbiter's, its workers') and the root's in the
    same format (gunicorn configures the root logger of each process from it)."""
    return {
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"funnel": {"()": f"{__name__}.{type(formatter(fmt)).__name__}"}},
        "filters": {"request_id": {"()": f"{__name__}.RequestIdFilter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "funnel",
                                "filters": ["request_id"], "stream": "ext://sys.stderr"}},
        "loggers": {name: {"handlers": ["stderr"], "propagate": False}
                    for name in ("gunicorn.error", "gunicorn.access")},
    }

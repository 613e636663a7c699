"""The web tier's settings: FUNNEL_* variables, each mirrored by a flag."""

from __future__ import annotations

from dataclasses import dataclass, field

from common import settings
from common.settings import setting
from common.tasks import Limits


@dataclass
class WebSettings:
    """The Funnel web tier: validates and preprocesses requests, queues jobs, waits for replies."""

    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port to bind")
    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis URL (redis:// or rediss://)")
    prefix: str = setting("funnel", "prefix of every Redis key")
    model_store: str = setting("model_store", "model store directory (model.json, tokenizers, labels)")
    models: list[str] = setting([], "models to serve, comma-separated (default: all in the store)")
    request_timeout_s: float = setting(30.0, "deadline of one request, queueing included")
    max_queue: int = setting(0, "answer 503 when a model's queue is this long (0: no limit)")
    max_body_mb: float = setting(20.0, "largest request body, in MiB")
    max_items: int = setting(64, "most texts in one request")
    max_text_chars: int = setting(20_000, "longest text, in characters")
    max_image_pixels: int = setting(40_000_000, "largest image, in pixels (decompression bomb guard)")
    api_keys: list[str] = setting([], "Bearer tokens that may call the API, comma-separated (default: open)")
    reply_inbox: bool = setting(True, "wait for replies through one shared inbox per process "
                                "(off: one BLPOP per request, on a reply key of its own)")
    processes: int = setting(2, "gunicorn worker processes")
    worker_class: str = setting("gthread", "gunicorn worker class: gthread (a thread per waiting request) "
                                "or gevent (a greenlet per request)", choices=["gthread", "gevent"])
    threads: int = setting(64, "threads per gunicorn process (each waits on one request)")
    log_level: str = setting("info", "logging level")
    access_log: bool = setting(False, "log one line per predict request (quiet by default under load)")
    limits: Limits = field(init=False, repr=False, default=None)

    def __post_init__(self):
        self.limits = Limits(max_items=self.max_items, max_text_chars=self.max_text_chars,
                             max_image_pixels=self.max_image_pixels)

    @classmethod
    def load(cls, argv: list[str] | None = None) -> "WebSettings":
        return settings.load(cls, argv, prog="python -m web")

"""The Flask app: validate and preprocess, queue through the gateway, answer JSON.

Imports nothing heavier than numpy, Pillow and tokenizers: no torch, no
transformers, no onnxruntime in the web tier.
"""

from __future__ import annotations

import hmac
import logging
import time
from pathlib import Path

import redis
from flask import Flask, Response, g, jsonify, render_template, request
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException

from common import tasks
from common.connection import connect
from common.errors import REPLY_STATUS, FunnelError, NotFound, Unavailable
from common.keys import Keys
from common.store import ModelSpec, list_models, load_spec
from common.wire import Reply
from web import metrics as web_metrics
from web import openapi
from web.gateway import Gateway
from web.inbox import Inbox
from web.jsonio import OrjsonProvider
from web.registry import describe, live_workers, queue_lengths
from web.settings import WebSettings

log = logging.getLogger("funnel.web")
access_log = logging.getLogger("funnel.web.access")


def load_models(settings: WebSettings) -> dict[str, ModelSpec]:
    names = settings.models or list_models(settings.model_store)
    if not names:
        raise SystemExit(f"no models in {settings.model_store}: run python scripts/prepare_model.py")
    return {name: load_spec(settings.model_store, name) for name in names}


def reply_error(reply: Reply, index: int, count: int) -> FunnelError:
    code, message = reply.error["code"], reply.error["message"]
    if count > 1:
        message = f"item {index}: {message}"
    return FunnelError(message, code=code, status=REPLY_STATUS.get(code, 500))


def create_app(settings: WebSettings | None = None, client: redis.Redis | None = None) -> Flask:
    settings = settings or WebSettings.load([])
    models = load_models(settings)
    keys = Keys(settings.prefix)
    client = client or connect(settings.redis_url, socket_timeout=settings.request_timeout_s + 5)
    inbox = Inbox(client, keys, on_unclaimed=web_metrics.UNCLAIMED.inc) if settings.reply_inbox else None
    gateway = Gateway(client, keys, settings.max_queue, inbox)
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"),
                static_folder=str(Path(__file__).parent / "static"))
    app.config["MAX_CONTENT_LENGTH"] = int(settings.max_body_mb * 1024 * 1024)
    app.json = OrjsonProvider(app)
    app.register_blueprint(openapi.blueprint)

    @app.errorhandler(FunnelError)
    def funnel_error(exc: FunnelError):
        response = jsonify(exc.to_json())
        response.status_code = exc.status
        if exc.status == 503:
            response.headers["Retry-After"] = "1"
        return response

    @app.errorhandler(redis.RedisError)
    def redis_error(exc: redis.RedisError):
        return funnel_error(Unavailable(f"queue unavailable: {type(exc).__name__}"))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code == 413:
            drain_body(request)
        code = (exc.name or "error").lower().replace(" ", "_")
        response = jsonify({"error": {"code": code, "message": exc.description}})
        response.status_code = exc.code or 500
        return response

    @app.before_request
    def check_api_key():
        if not settings.api_keys or request.endpoint in ("healthz", "readyz", "index", "static",
                                                         "openapi.document"):
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.strip().encode()
        # Compare against every key, always: the timing says nothing about which matched.
        matched = False
        for key in settings.api_keys:
            matched |= hmac.compare_digest(given, key.encode())
        if scheme.lower() != "bearer" or not matched:
            response = jsonify({"error": {"code": "unauthorized",
                                          "message": "send a valid API key as 'Authorization: Bearer <key>'"}})
            response.status_code = 401
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return None

    @app.get("/")
    def index():
        return render_template("index.html", models=models.values())

    @app.get("/healthz")
    def healthz():
        """Liveness: this process answers. Redis and workers are /readyz's business."""
        return jsonify({"status": "ok"})

    @app.get("/readyz")
    def readyz():
        """Readiness: Redis answers and every served model has a live worker."""
        try:
            workers = live_workers(client, keys)
        except redis.RedisError as exc:
            return jsonify({"status": "unavailable", "reason": f"redis: {type(exc).__name__}"}), 503
        missing = [name for name in models if not any(w.get("model") == name for w in workers)]
        if missing:
            return jsonify({"status": "unavailable",
                            "reason": f"no live worker for {', '.join(missing)}"}), 503
        return jsonify({"status": "ok", "workers": len(workers)})

    @app.get("/v1/models")
    def list_served():
        workers = live_workers(client, keys)
        lengths = queue_lengths(client, keys, list(models))
        return jsonify({"models": [describe(spec, workers, lengths[name]) for name, spec in models.items()]})

    @app.get("/v1/models/<name>")
    def describe_model(name: str):
        spec = served_model(name)
        return jsonify(describe(spec, live_workers(client, keys), queue_lengths(client, keys, [name])[name]))

    @app.get("/metrics")
    def metrics():
        return Response(web_metrics.render(client, keys, list(models)), mimetype=CONTENT_TYPE_LATEST)

    def served_model(name: str) -> ModelSpec:
        spec = models.get(name)
        if spec is None:
            raise NotFound(f"no model named {name!r}; served: {', '.join(models)}", code="unknown_model")
        return spec

    @app.before_request
    def start_clock():
        g.started = time.perf_counter()

    @app.after_request
    def count_request(response):
        if request.endpoint == "predict":
            model = request.view_args["name"] if request.view_args["name"] in models else "unknown"
            # A request refused by an earlier hook (no API key) never started the clock.
            seconds = time.perf_counter() - g.get("started", time.perf_counter())
            web_metrics.REQUESTS.labels(model, str(response.status_code)).inc()
            web_metrics.LATENCY.labels(model).observe(seconds)
            if settings.access_log:
                access_log.info("request model=%s status=%d ms=%.1f bytes=%s", model,
                                response.status_code, seconds * 1000, request.content_length)
        return response

    @app.post("/v1/models/<name>/predict")
    def predict(name: str):
        spec = served_model(name)
        task = tasks.get(spec.task)
        items, single = task.parse(request, settings.limits)
        inputs = [task.preprocess(item, spec, settings.limits) for item in items]
        replies = gateway.submit(name, inputs, settings.request_timeout_s)
        for reply in replies:
            web_metrics.QUEUE_WAIT.labels(name).observe(reply.queue_ms / 1000)
            web_metrics.RODE_IN.labels(name).observe(reply.batch_size)
        for i, reply in enumerate(replies):
            if not reply.ok:
                raise reply_error(reply, i, len(replies))
        results = [reply.outputs for reply in replies]  # numpy arrays are written by OrjsonProvider
        meta = [{"worker": r.worker, "batch_size": r.batch_size,
                 "queue_ms": round(r.queue_ms, 2), "infer_ms": round(r.infer_ms, 2)} for r in replies]
        if single:
            return jsonify({"model": name, **results[0], "meta": meta[0]})
        return jsonify({"model": name, "results": results, "meta": meta})

    return app


DRAIN_LIMIT = 64 * 1024 * 1024


def drain_body(req) -> None:
    """Read and drop an oversized body, so the client reads our 413 instead of a reset."""
    length = req.content_length or 0
    if length > DRAIN_LIMIT:
        return
    stream = req.environ.get("wsgi.input")
    while length > 0 and stream is not None:
        chunk = stream.read(min(length, 1 << 16))
        if not chunk:
            break
        length -= len(chunk)

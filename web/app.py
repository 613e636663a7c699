"""The Flask app: validate and preprocess, queue through the gateway, answer JSON.

Imports nothing heavier than numpy, Pillow and tokenizers: no torch, no
transformers, no onnxruntime in the web tier.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import numpy as np
import redis
from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from common import tasks
from common.connection import connect
from common.errors import REPLY_STATUS, FunnelError, NotFound, Unavailable
from common.keys import Keys
from common.store import ModelSpec, list_models, load_spec
from common.wire import Reply
from web.gateway import Gateway
from web.settings import WebSettings

log = logging.getLogger("funnel.web")


def load_models(settings: WebSettings) -> dict[str, ModelSpec]:
    names = settings.models or list_models(settings.model_store)
    if not names:
        raise SystemExit(f"no models in {settings.model_store}: run python scripts/prepare_model.py")
    return {name: load_spec(settings.model_store, name) for name in names}


def to_json(value):
    """Reply outputs as JSON: tensors become (nested) lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


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
    gateway = Gateway(client, keys, settings.max_queue)
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"))
    app.config["MAX_CONTENT_LENGTH"] = int(settings.max_body_mb * 1024 * 1024)
    app.json.sort_keys = False

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
        if not settings.api_keys or request.endpoint in ("healthz", "index", "static"):
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
        try:
            client.ping()
        except redis.RedisError as exc:
            return jsonify({"status": "unavailable", "redis": type(exc).__name__}), 503
        return jsonify({"status": "ok", "models": list(models)})

    @app.get("/v1/models")
    def list_served():
        workers = live_workers(client, keys)
        return jsonify({"models": [
            {**spec.public(), "queue": gateway.queue_depth(name),
             "workers": [w for w in workers if w.get("model") == name]}
            for name, spec in models.items()]})

    @app.post("/v1/models/<name>/predict")
    def predict(name: str):
        spec = models.get(name)
        if spec is None:
            raise NotFound(f"no model named {name!r}; served: {', '.join(models)}",
                           code="unknown_model")
        task = tasks.get(spec.task)
        items, single = task.parse(request, settings.limits)
        inputs = [task.preprocess(item, spec, settings.limits) for item in items]
        replies = gateway.submit(name, inputs, settings.request_timeout_s)
        for i, reply in enumerate(replies):
            if not reply.ok:
                raise reply_error(reply, i, len(replies))
        results = [to_json(reply.outputs) for reply in replies]
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


def live_workers(client: redis.Redis, keys: Keys) -> list[dict]:
    """Workers whose heartbeat hash has not expired."""
    try:
        ids = sorted(i.decode() for i in client.hkeys(keys.workers()))
        pipe = client.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(keys.worker(worker_id))
        found = pipe.execute()
    except redis.RedisError:
        return []
    return [{"id": worker_id, **{k.decode(): v.decode() for k, v in info.items()}}
            for worker_id, info in zip(ids, found) if info]

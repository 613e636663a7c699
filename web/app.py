"""The Flask app: the page, the listings, the job routes, the probes and metrics.

Predict-like routes are the front's (transport/front.py), on the event loop;
Flask answers every other route, in a2wsgi's threads. The web tier imports
nothing heavier than numpy, Pillow and tokenizers: no torch, no transformers,
no onnxruntime (tests/unit/test_web_imports.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import redis
from flask import Flask, Response, jsonify, render_template
from prometheus_client import CONTENT_TYPE_LATEST

from funnel.common import tasks
from funnel.common.registry import live_workers, queue_lengths
from funnel.common.store import list_models, load_spec
from funnel.common.tasks import Task
from funnel.web import auth, errors, openapi
from funnel.web import metrics as web_metrics
from funnel.web.jsonio import OrjsonProvider
from funnel.web.pipeline import Pipeline
from funnel.web.protocols import jobs, v2
from funnel.web.settings import WebSettings

log = logging.getLogger("funnel.web")


def load_models(settings: WebSettings) -> dict[str, Task]:
    """Each served model's task, with the limits FUNNEL_LIMITS overrides."""
    names = settings.models or list_models(settings.model_store)
    if not names:
        raise SystemExit(f"no models in {settings.model_store}: run funnel prepare --store {settings.model_store}")
    limits = parse_limits(settings.limits)
    models = {name: tasks.load(load_spec(settings.model_store, name), limits) for name in names}
    unused = set(limits) - {name for task in models.values() for name in task.limits}
    if unused:
        raise SystemExit(f"FUNNEL_LIMITS names {', '.join(sorted(unused))}, which no served model has")
    return models


def parse_limits(pairs: list[str]) -> dict[str, int]:
    try:
        return {name.strip(): int(value) for name, _, value in (p.partition("=") for p in pairs)}
    except ValueError:
        raise SystemExit(f"FUNNEL_LIMITS takes name=integer pairs, not {pairs!r}") from None


def describe(task: Task, workers: list[dict], queue_length: int) -> dict:
    """One model as GET /v1/models shows it: spec, task fields, limits, queue and live workers."""
    return {**task.spec.public(), "input_kind": task.input_kind, "limits": task.limits, **task.public(),
            "queue": queue_length, "workers": [w for w in workers if w.get("model") == task.spec.name]}


def create_app(settings: WebSettings, pipeline: Pipeline) -> Flask:
    models, client, keys = pipeline.models, pipeline.client, pipeline.keys
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"),
                static_folder=str(Path(__file__).parent / "static"))
    app.config["MAX_CONTENT_LENGTH"] = int(settings.max_body_mb * 1024 * 1024)
    app.json = OrjsonProvider(app)
    app.register_blueprint(openapi.blueprint)
    errors.install(app)
    auth.install(app, settings.api_keys)
    app.register_blueprint(v2.create_blueprint(models, pipeline.resolve, client, keys))
    jobs.install(app, pipeline, settings)

    @app.get("/")
    def index():
        return render_template("index.html", models=[
            {**task.spec.public(), "input_kind": task.input_kind} for task in models.values()])

    install_operations(app, pipeline)
    return app


def install_operations(app: Flask, pipeline: Pipeline) -> None:
    """What probes, dashboards and operators read: health, readiness, the models, metrics."""
    models, client, keys = pipeline.models, pipeline.client, pipeline.keys

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
        return jsonify({"models": [describe(task, workers, lengths[name]) for name, task in models.items()]})

    @app.get("/v1/models/<name>")
    def describe_model(name: str):
        task = pipeline.resolve(name)
        return jsonify(describe(task, live_workers(client, keys), queue_lengths(client, keys, [name])[name]))

    @app.get("/metrics")
    def metrics():
        # content_type, not mimetype: Flask would add a second "charset" to Prometheus' own.
        return Response(web_metrics.render(client, keys, list(models)), content_type=CONTENT_TYPE_LATEST)

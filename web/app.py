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
from flask import Flask, Response, jsonify, render_template, request
from prometheus_client import CONTENT_TYPE_LATEST

from funnel.common.contracts import registry, repository, traffic
from funnel.common.contracts.registry import live_workers
from funnel.common.errors import BadInput
from funnel.common.observability import logs
from funnel.common.tasks import Task
from funnel.web import auth, dashboard, errors, openapi
from funnel.web import metrics as web_metrics
from funnel.web.catalog import Catalog
from funnel.web.jsonio import OrjsonProvider
from funnel.web.pipeline import Pipeline
from funnel.web.routes import batches, jobs, v2
from funnel.web.settings import WebSettings

log = logging.getLogger("funnel.web")


def catalog_of(settings: WebSettings) -> Catalog:
    """The served models, their versions live from the store, with the limits FUNNEL_LIMITS overrides."""
    limits = parse_limits(settings.limits)
    catalog = Catalog(settings.model_store, settings.models, limits)
    if not catalog.names():
        raise SystemExit(f"no models in {settings.model_store}: run funnel prepare --store {settings.model_store}")
    unused = set(limits) - {name for task in catalog.tasks() for name in task.limits}
    if unused:
        raise SystemExit(f"FUNNEL_LIMITS names {', '.join(sorted(unused))}, which no served model has")
    return catalog


def parse_limits(pairs: list[str]) -> dict[str, int]:
    try:
        return {name.strip(): int(value) for name, _, value in (p.partition("=") for p in pairs)}
    except ValueError:
        raise SystemExit(f"FUNNEL_LIMITS takes name=integer pairs, not {pairs!r}") from None


def describe(pipeline: Pipeline, name: str, workers: list[dict]) -> dict:
    """One model as GET /v1/models shows it: its newest version's spec, task fields and limits, then
    every version with its queue, live workers, traffic weight and whether it is unloaded, and the model's
    totals."""
    versions = pipeline.catalog.versions(name)
    task = versions[max(versions)]
    weights = traffic.read(pipeline.client, pipeline.keys, name)
    unloaded = repository.read(pipeline.client, pipeline.keys, name)
    lengths = registry.version_queue_lengths(pipeline.client, pipeline.keys, {name: versions})[name]
    mine = [w for w in workers if w.get("model") == name]
    return {**openai_model(task), **task.spec.public(), "input_kind": task.input_kind, "limits": task.limits,
            **({"content_types": list(task.content_types)} if task.input_kind == "file" else {}),
            **task.public(), "queue": sum(lengths.values()), "workers": mine,
            "traffic": {str(v): weight for v, weight in sorted(weights.items())} or None,
            "versions": [{"version": v, "queue": lengths[v], "weight": weights.get(v), "unloaded": v in unloaded,
                          "workers": [w["id"] for w in mine if registry.version_of(w) == v]}
                         for v in sorted(versions)]}


def openai_model(task: Task) -> dict:
    """A model as OpenAI's API lists it (GET /v1/models' "data", and beside Funnel's fields in
    GET /v1/models/<name>): an OpenAI client reads these four fields, a Funnel client the others."""
    created = (task.spec.path / "model.json").stat().st_mtime  # when the served version was stored
    return {"id": task.spec.name, "object": "model", "created": int(created), "owned_by": "funnel"}


def create_app(settings: WebSettings, pipeline: Pipeline) -> Flask:
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"),
                static_folder=str(Path(__file__).parent / "static"))
    app.config["MAX_CONTENT_LENGTH"] = int(settings.max_body_mb * 1024 * 1024)
    app.json = OrjsonProvider(app)
    app.register_blueprint(openapi.blueprint)
    errors.install(app)
    install_request_ids(app)
    auth.install(app, settings.api_keys)
    app.register_blueprint(v2.create_blueprint(pipeline))
    jobs.install(app, pipeline, settings)
    batches.install(app, pipeline, settings)

    @app.get("/")
    def index():
        return render_template("index.html", models=[
            {**task.spec.public(), "input_kind": task.input_kind, "content_types": task.content_types}
            for task in pipeline.catalog.tasks()])

    install_operations(app, pipeline)
    install_traffic(app, pipeline, settings)
    app.register_blueprint(dashboard.create_blueprint(pipeline, settings))
    return app


def install_request_ids(app: Flask) -> None:
    """Every answer names its request's id (X-Request-ID, or one made up), as do the log lines about it."""

    @app.before_request
    def take_request_id():
        logs.REQUEST_ID.set(logs.request_id_of(request.headers.get("X-Request-ID")))

    @app.after_request
    def give_request_id(response: Response) -> Response:
        response.headers["X-Request-ID"] = logs.REQUEST_ID.get()
        return response


def install_operations(app: Flask, pipeline: Pipeline) -> None:
    """What probes, dashboards and operators read: health, readiness, the models, metrics."""
    catalog, client, keys = pipeline.catalog, pipeline.client, pipeline.keys

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
        missing = [name for name in catalog.names() if not registry.versions_live(workers, name)]
        if missing:
            return jsonify({"status": "unavailable",
                            "reason": f"no live worker for {', '.join(missing)}"}), 503
        return jsonify({"status": "ok", "workers": len(workers)})

    @app.get("/v1/models")
    def list_served():
        """Funnel's "models" and, in the same object, OpenAI's list ("object", "data"): both clients
        read it, each ignoring the other's fields."""
        workers = live_workers(client, keys)
        return jsonify({"models": [describe(pipeline, name, workers) for name in catalog.names()],
                        "object": "list", "data": [openai_model(task) for task in catalog.tasks()]})

    @app.get("/v1/models/<name>")
    def describe_model(name: str):
        pipeline.stored(name)
        return jsonify(describe(pipeline, name, live_workers(client, keys)))

    @app.get("/metrics")
    def metrics():
        # content_type, not mimetype: Flask would add a second "charset" to Prometheus' own.
        versions = {name: sorted(catalog.versions(name)) for name in catalog.names()}
        return Response(web_metrics.render(client, keys, versions), content_type=CONTENT_TYPE_LATEST)


def install_traffic(app: Flask, pipeline: Pipeline, settings: WebSettings) -> None:
    """A model's traffic policy, set and cleared by admin keys (common/contracts/traffic.py)."""
    catalog, client, keys = pipeline.catalog, pipeline.client, pipeline.keys

    @app.put("/v1/models/<name>/traffic")
    def set_traffic(name: str):
        """{"weights": {"<version>": <weight>, ...}}: the share of unpinned requests each version takes."""
        auth.require_admin(settings)
        pipeline.stored(name)
        weights = parse_weights(request.get_json(silent=True), set(catalog.versions(name)), name)
        try:
            traffic.write(client, keys, name, weights)
        except ValueError as exc:
            raise BadInput(str(exc), code="bad_traffic") from None
        return jsonify(describe(pipeline, name, live_workers(client, keys)))

    @app.delete("/v1/models/<name>/traffic")
    def clear_traffic(name: str):
        """No policy: every unpinned request goes to the highest version with a live worker."""
        auth.require_admin(settings)
        pipeline.stored(name)
        traffic.clear(client, keys, name)
        return jsonify(describe(pipeline, name, live_workers(client, keys)))


def parse_weights(body: object, versions: set[int], name: str) -> dict[int, int]:
    """{"weights": {"1": 90, "2": 10}} as {1: 90, 2: 10}; 400 bad_traffic for any other shape or a
    version the model does not have."""
    weights = body.get("weights") if isinstance(body, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, str) and v.isascii() and v.isdigit() for v in weights) \
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in weights.values()):
        raise BadInput('send {"weights": {"<version>": <integer weight>, ...}}', code="bad_traffic")
    unknown = sorted(set(map(int, weights)) - versions)
    if unknown:
        raise BadInput(f"{name} has no version {unknown[0]}", code="bad_traffic")
    return {int(v): w for v, w in weights.items()}

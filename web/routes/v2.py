"""The Open Inference Protocol's probes and metadata (GET /v2...), answered by Flask; infer is the
ASGI front's, through the pipeline (web/protocols/v2.py parses and renders it)."""

from __future__ import annotations

import orjson
import redis
from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from funnel.common.errors import BadInput, FunnelError
from funnel.web import auth, introspection, repository
from funnel.web.pipeline import Pipeline
from funnel.web.protocols import v2
from funnel.web.readiness import model_live, models_without_workers


def error_response(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status=status, mimetype="application/json")


def parameters() -> dict:
    """A repository call's `parameters` ({} without a body); 400 for a body that is no such object."""
    body = request.get_json(force=True, silent=True) if request.content_length else {}  # tritonclient: no type
    found = body.get("parameters", {}) if isinstance(body, dict) else None
    if not isinstance(found, dict):
        raise BadInput('send {"parameters": {...}}, or no body', code="bad_parameters")
    return found


def install_probes(routes: Blueprint, pipeline: Pipeline) -> None:
    """Server metadata, liveness and readiness, model metadata and readiness; Triton's model configuration
    and statistics."""
    catalog = pipeline.catalog

    @routes.get("")
    def server_metadata():
        return {"name": "funnel", "version": v2.server_version(), "extensions": v2.EXTENSIONS}

    @routes.get("/health/live")
    def live():
        return {"live": True}

    @routes.get("/health/ready")
    def ready():
        missing = models_without_workers(pipeline)
        if missing:
            return error_response(f"no live worker for {', '.join(sorted(missing))}", 503)
        return {"ready": True}

    @routes.get("/models/<name>")
    @routes.get("/models/<name>/versions/<model_version>")
    def model_metadata(name: str, model_version: str | None = None):
        return v2.metadata(pipeline.resolve(name, model_version), sorted(catalog.versions(name)))

    @routes.get("/models/<name>/ready")
    @routes.get("/models/<name>/versions/<model_version>/ready")
    def model_ready(name: str, model_version: str | None = None):
        if not model_live(pipeline, name, model_version):
            return error_response(f"no live worker for {name}" + (f" version {model_version}" if model_version
                                                                    else ""), 503)
        return {"name": name, "ready": True}

    @routes.get("/models/<name>/config")
    @routes.get("/models/<name>/versions/<model_version>/config")
    def model_config(name: str, model_version: str | None = None):
        return introspection.model_config(pipeline, name, model_version)

    @routes.get("/models/stats")
    @routes.get("/models/<name>/stats")
    @routes.get("/models/<name>/versions/<model_version>/stats")
    def model_statistics(name: str = "", model_version: str | None = None):
        return introspection.model_statistics(pipeline, name, model_version)


def install_repository(routes: Blueprint, pipeline: Pipeline) -> None:
    """Triton's repository extension (web/repository.py): the index of the store, and load and unload
    for admin keys."""
    settings = pipeline.settings

    @routes.post("/repository/index")
    def repository_index():
        asked = request.get_json(silent=True) or {}
        return Response(orjson.dumps(repository.index(pipeline, bool(asked.get("ready", False)))),
                        mimetype="application/json")

    @routes.post("/repository/models/<name>/load")
    def repository_load(name: str):
        auth.require_admin(settings)
        repository.load(pipeline, name, parameters(), settings.request_timeout_s)
        return {}

    @routes.post("/repository/models/<name>/unload")
    def repository_unload(name: str):
        auth.require_admin(settings)
        repository.unload(pipeline, name, parameters(), settings.request_timeout_s)
        return {}


def create_blueprint(pipeline: Pipeline) -> Blueprint:
    """The protocol's probes and metadata, answered by Flask (infer is the front's: V2)."""
    routes = Blueprint("v2", __name__, url_prefix="/v2")

    @routes.errorhandler(FunnelError)
    @routes.errorhandler(redis.RedisError)
    @routes.errorhandler(HTTPException)
    def protocol_error(exc: Exception):
        status, body, headers = v2.V2(0).render_error(exc, request)
        return Response(body, status=status, headers=headers, mimetype="application/json")

    install_probes(routes, pipeline)
    install_repository(routes, pipeline)
    return routes

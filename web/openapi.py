"""GET /openapi.json: the API's OpenAPI 3 document (web/openapi.json, a static file)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response

SPEC = Path(__file__).with_name("openapi.json")

blueprint = Blueprint("openapi", __name__)


@blueprint.get("/openapi.json")
def document() -> Response:
    response = Response(SPEC.read_bytes(), mimetype="application/json")
    response.headers["Cache-Control"] = "public, max-age=300"
    response.headers["Access-Control-Allow-Origin"] = "*"  # API explorers on other origins may read it
    return response

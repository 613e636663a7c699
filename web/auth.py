"""API keys: with FUNNEL_API_KEYS set, every route but the probes, the page and the API document
needs `Authorization: Bearer <key>`."""

from __future__ import annotations

import hmac

from flask import Flask, jsonify, request

# Probes (ours and the /v2 protocol's), the page and the API document stay open.
OPEN_ENDPOINTS = ("healthz", "readyz", "index", "static", "openapi.document", "v2.live", "v2.ready")


def authorized(authorization: str, api_keys: list[str]) -> bool:
    """Whether an Authorization header's value names one of the keys, as a Bearer token."""
    scheme, _, token = authorization.partition(" ")
    given = token.strip().encode()
    # Compare against every key, always: the timing says nothing about which matched.
    matched = False
    for key in api_keys:
        matched |= hmac.compare_digest(given, key.encode())
    return scheme.lower() == "bearer" and matched


def install(app: Flask, api_keys: list[str]) -> None:
    @app.before_request
    def check_api_key():
        if not api_keys or request.endpoint in OPEN_ENDPOINTS:
            return None
        if not authorized(request.headers.get("Authorization", ""), api_keys):
            message = "send a valid API key as 'Authorization: Bearer <key>'"
            # /v2 answers in the Open Inference Protocol's error shape, a string.
            error = message if request.blueprint == "v2" else {"code": "unauthorized", "message": message}
            response = jsonify({"error": error})
            response.status_code = 401
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return None

"""API keys: with FUNNEL_API_KEYS set, every route but the probes, the page and the API document
needs `Authorization: Bearer <key>`. The front checks predict-like routes (transport/front.py),
Flask's hook the rest; both answer 401 in the route's protocol shape."""

from __future__ import annotations

import hmac

from flask import Flask, request

from funnel.common.errors import FunnelError
from funnel.web.settings import WebSettings

# Probes (ours and the /v2 protocol's), the page and the API document stay open.
OPEN_ENDPOINTS = ("healthz", "readyz", "index", "static", "openapi.document", "v2.live", "v2.ready")


class Forbidden(FunnelError):
    status, code = 403, "forbidden"


class Unauthorized(FunnelError):
    status, code = 401, "unauthorized"

    def __init__(self):
        super().__init__("send a valid API key as 'Authorization: Bearer <key>'")


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
        if api_keys and request.endpoint not in OPEN_ENDPOINTS \
                and not authorized(request.headers.get("Authorization", ""), api_keys):
            raise Unauthorized()


def require_admin(settings: WebSettings) -> None:
    """403 unless the request's key is an admin key (FUNNEL_ADMIN_KEYS), where API keys are set: what
    changes how a model is served is an operator's business, not every client's."""
    if settings.api_keys and not authorized(request.headers.get("Authorization", ""), settings.admin_keys):
        raise Forbidden("this needs an admin API key (FUNNEL_ADMIN_KEYS)")

"""API keys: with FUNNEL_API_KEYS set, every route but the probes, the page and the API document
needs `Authorization: Bearer <key>`. The front checks predict-like routes (transport/front.py),
Flask's hook the rest; both answer 401 in the route's protocol shape.

Keys are tenants. FUNNEL_API_KEYS names each key by a label, `alice=KEY1,bob=KEY2`, or gives it
bare (`KEY`: labelled `key-<8 hex digits of its owner hash>`), so that metrics, logs and `funnel
inspect` say whose jobs they are without printing a key. A request's key is found once (identify,
in Flask's hook): its Identity, the label and the owner hash, a keyed hash of the key that a job
records (never the key). FUNNEL_ADMIN_KEYS names, by label or by key, the keys that may also
change how models are served and read or cancel any tenant's job: `is_admin` is the one place
that marking is read.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from dataclasses import dataclass

from flask import Flask, g, request

from funnel.common.bulk.jobs import Caller
from funnel.common.errors import FunnelError
from funnel.web.settings import WebSettings

# Probes (ours and the /v2 protocol's), the pages and the API document stay open: the pages hold
# no data, what they show comes from routes that ask for a key.
OPEN_ENDPOINTS = ("healthz", "readyz", "index", "dashboard.page", "static", "openapi.document", "v2.live",
                  "v2.ready")

# The owner hash is HMAC-SHA256 of the key under this fixed context: what a job records, never the key.
OWNER_CONTEXT = b"funnel job owner v1"
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Forbidden(FunnelError):
    status, code = 403, "forbidden"


class Unauthorized(FunnelError):
    status, code = 401, "unauthorized"

    def __init__(self):
        super().__init__("send a valid API key as 'Authorization: Bearer <key>'")


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Whose key a request carries: its label and its owner hash (never the key)."""

    label: str
    owner: str


def owner_of(key: str) -> str:
    """A key's owner hash, hex: what a job records of who submitted it."""
    return hmac.new(OWNER_CONTEXT, key.encode(), hashlib.sha256).hexdigest()


def split_entry(entry: str) -> tuple[str, str]:
    """One FUNNEL_API_KEYS entry as (label, key): `label=key`, or a bare key with a label made from
    its owner hash. Only the first '=' splits, and only after a label-like name with more than
    '=' padding after it: a base64 key's trailing '=' keeps it bare (a key with '=' inside needs
    a label)."""
    label, sep, key = entry.partition("=")
    if sep and LABEL.match(label) and key.strip("="):
        return label, key
    return f"key-{owner_of(entry)[:8]}", entry


@functools.lru_cache(maxsize=16)
def keyring(api_keys: tuple[str, ...]) -> tuple[tuple[bytes, Identity], ...]:
    """Each key, as the bytes a Bearer token is compared with, and its Identity; made once per
    process (the owner hashes included), not per request."""
    return tuple((key.encode(), Identity(label=label, owner=owner_of(key)))
                 for label, key in map(split_entry, api_keys))


@functools.lru_cache(maxsize=16)
def admin_owners(api_keys: tuple[str, ...], admin_keys: tuple[str, ...]) -> frozenset[str]:
    """The owner hashes of the admin keys: each FUNNEL_ADMIN_KEYS entry names API keys by label,
    or a key itself (bare, or as `label=key`)."""
    labels = set(admin_keys)
    named = {key for _, key in map(split_entry, admin_keys)}
    return frozenset(owner_of(key) for label, key in map(split_entry, api_keys)
                     if label in labels or key in named)


def identify(authorization: str, api_keys: list[str]) -> Identity | None:
    """The Identity of the key an Authorization header's value names, as a Bearer token, else None.
    Compared against every key, always: the timing says nothing about which matched, or whether
    one did."""
    scheme, _, token = authorization.partition(" ")
    given = token.strip().encode()
    found = None
    for key, identity in keyring(tuple(api_keys)):
        if hmac.compare_digest(given, key):
            found = identity
    return found if scheme.lower() == "bearer" else None


def install(app: Flask, api_keys: list[str]) -> None:
    @app.before_request
    def check_api_key():
        if api_keys and request.endpoint not in OPEN_ENDPOINTS:
            g.funnel_identity = identify(request.headers.get("Authorization", ""), api_keys)
            if g.funnel_identity is None:
                raise Unauthorized()


def current(settings: WebSettings) -> Identity | None:
    """The Identity of this request's key: found once, by the hook above, for every route it guards."""
    if "funnel_identity" not in g:
        g.funnel_identity = identify(request.headers.get("Authorization", ""), settings.api_keys)
    return g.funnel_identity


def is_admin(identity: Identity | None, settings: WebSettings) -> bool:
    """Whether the key is an admin key (FUNNEL_ADMIN_KEYS): the one place the marking is read."""
    return identity is not None and identity.owner in admin_owners(tuple(settings.api_keys),
                                                                   tuple(settings.admin_keys))


def require_admin(settings: WebSettings, identity: Identity | None = None) -> None:
    """403 unless the request's key (this Flask request's, or the identity a gRPC call's metadata gave)
    is an admin key (FUNNEL_ADMIN_KEYS), where API keys are set: what changes how a model is served is
    an operator's business, not every client's."""
    if settings.api_keys and not is_admin(identity or current(settings), settings):
        raise Forbidden("this needs an admin API key (FUNNEL_ADMIN_KEYS)")


def caller(settings: WebSettings) -> Caller:
    """Who this request is to the job store: its key's owner hash and label, and whether it is an
    admin key; with no API keys set, anyone (every job open to every request, as before)."""
    if not settings.api_keys:
        return Caller.anyone()
    identity = current(settings)
    if identity is None:  # the hook refuses such a request first: never reached through a route
        raise Unauthorized()
    return Caller(owner=identity.owner, label=identity.label, admin=is_admin(identity, settings))

"""Redis connections from FUNNEL_REDIS_URL (redis://, rediss:// for TLS, password allowed)."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# Refused or unreachable Redis must fail fast: nobody waits on a dead socket.
CONNECT_TIMEOUT_S = 1.0


def connect(url: str, *, socket_timeout: float | None, max_connections: int | None = None) -> redis.Redis:
    """A client whose blocking calls may run up to socket_timeout seconds.

    One immediate retry replaces a pooled connection that died with a Redis
    restart; anything longer is the caller's to decide (503, or backoff).
    """
    pool = redis.BlockingConnectionPool.from_url(
        url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=socket_timeout,
        health_check_interval=30, max_connections=max_connections or 256, timeout=CONNECT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError])
    return redis.Redis(connection_pool=pool)

"""Redis connections from FUNNEL_REDIS_URL: one Redis, the primary that Redis Sentinel names, or a Redis Cluster.

    redis://[[user]:password@]host[:port][/db]          one Redis (rediss:// for TLS)
    redis+sentinel://[[user]:password@]host1[:port1],host2[:port2],.../service[/db]
                                                        the primary of `service`, asked of the Sentinels
                                                        (rediss+sentinel:// for TLS to both)
    redis+cluster://[[user]:password@]host1[:port1],host2[:port2],...
                                                        a Redis Cluster, found from any of these nodes
                                                        (rediss+cluster:// for TLS)

Query options are redis-py's for plain URLs (ssl_ca_certs=, ssl_cert_reqs=, ...), for the
primary; sentinel_username= and sentinel_password= authenticate to the Sentinels when they
have requirepass (the user and password before the @ are the primary's). A Sentinel's port
defaults to 26379, the db to 0. A cluster node's port defaults to 6379; a cluster has only db 0,
so its URL names none; its query options are redis-py's, as for a plain URL.

Every Redis client Funnel makes from a URL comes from connect(): a 1 s connect timeout, one
immediate retry on a connection error, health checks. Through Sentinel each new connection
asks the Sentinels where the primary is, so after a failover the retry (or the next command)
lands on the new primary with no restart; a connection still open to a demoted primary is
dropped at its first refused write. On a cluster, redis-py's RedisCluster learns the slot map
from the nodes given, sends each command to the node owning its key's slot and follows MOVED
after a resharding or failover; a script or MULTI whose keys span slots is refused
(common/contracts/keys.py tags every key of one atomic step with its model, so none does).
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

# Refused or unreachable Redis must fail fast: nobody waits on a dead socket.
CONNECT_TIMEOUT_S = 1.0
# A Sentinel answers one small command; one that does not within this is skipped for the next.
SENTINEL_TIMEOUT_S = 1.0
SENTINEL_PORT = 26379
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
SENTINEL_AUTH = ("sentinel_username", "sentinel_password")
CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
CLUSTER_PORT = 6379
# Redis before 7 reports a script's write refused by a replica as a script error, not READONLY.
_READONLY_IN_SCRIPT = "READONLY You can't write against a read only replica"


@dataclass(frozen=True)
class SentinelURL:
    """A redis+sentinel:// URL taken apart: where the Sentinels are, which service, how to log in."""

    sentinels: list[tuple[str, int]]
    service: str
    _: KW_ONLY
    tls: bool = False
    primary: dict[str, Any] = field(default_factory=dict)   # db, username, password, query options
    sentinel: dict[str, Any] = field(default_factory=dict)  # the Sentinels' username, password, TLS


def is_sentinel(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """redis+sentinel://[[user]:password@]host1[:port1],host2[:port2]/service[/db][?options]."""
    form = "redis+sentinel://[[user]:password@]host1:port1,host2:port2/service[/db]"
    shown, tls, parts, userinfo, hosts = _split(url, SENTINEL_SCHEMES, "Sentinel", form)
    sentinels = [_host_port(item, shown) for item in hosts.split(",") if item.strip()]
    path = [urllib.parse.unquote(p) for p in parts.path.split("/") if p]
    if not sentinels or not 1 <= len(path) <= 2:
        raise ValueError(f"a Sentinel URL names its Sentinels and a service: {form}, not {shown!r}")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"the database after the service is a number: {form}, not {shown!r}")
    query = urllib.parse.parse_qs(parts.query)
    auth = {name.removeprefix("sentinel_"): query.pop(name)[0] for name in SENTINEL_AUTH if name in query}
    # The primary's options exactly as for a plain URL: redis-py parses and types them.
    plain = urllib.parse.urlunsplit((parts.scheme, f"{userinfo + '@' if userinfo else ''}primary",
                                     f"/{path[1] if len(path) == 2 else 0}",
                                     urllib.parse.urlencode(query, doseq=True), ""))
    primary = {k: v for k, v in parse_url(plain).items() if k not in ("host", "port", "connection_class")}
    ssl_options = {k: v for k, v in primary.items() if k.startswith("ssl_")}
    sentinel = {**auth, **({"ssl": True, **ssl_options} if tls else {})}
    return SentinelURL(sentinels, path[0], tls=tls, primary=primary, sentinel=sentinel)


@dataclass(frozen=True)
class ClusterURL:
    """A redis+cluster:// URL taken apart: the nodes to start from and the options for every node."""

    nodes: list[tuple[str, int]]
    options: dict[str, Any] = field(default_factory=dict)  # username, password, TLS and query options


def is_cluster(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterURL:
    """redis+cluster://[[user]:password@]host1[:port1],host2[:port2],...[?options]."""
    form = "redis+cluster://[[user]:password@]host1:port1,host2:port2,..."
    shown, tls, parts, userinfo, hosts = _split(url, CLUSTER_SCHEMES, "Cluster", form)
    nodes = [_host_port(item, shown, CLUSTER_PORT) for item in hosts.split(",") if item.strip()]
    if not nodes:
        raise ValueError(f"a Cluster URL names at least one node: {form}, not {shown!r}")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0: {form}, not {shown!r}")
    # The nodes' options exactly as for a plain URL: redis-py parses and types them.
    plain = urllib.parse.urlunsplit((parts.scheme, f"{userinfo + '@' if userinfo else ''}node", "/0",
                                     parts.query, ""))
    options = {k: v for k, v in parse_url(plain).items() if k not in ("host", "port", "db", "connection_class")}
    return ClusterURL(nodes, {**options, **({"ssl": True} if tls else {})})


def _split(url: str, schemes: dict[str, bool], kind: str, form: str):
    """A URL of several hosts taken apart: (itself with its password starred, TLS or not, its parts
    as a plain redis:// URL, the user and password, the comma-separated hosts)."""
    shown = _redacted(url)
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in schemes or not rest:
        raise ValueError(f"not a {kind} URL ({form}): {shown!r}")
    tls = schemes[scheme.lower()]
    parts = urllib.parse.urlsplit(f"{'rediss' if tls else 'redis'}://{rest}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    return shown, tls, parts, userinfo, hosts


def _redacted(url: str) -> str:
    """The URL for an error message: its password starred out."""
    return re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", url)


def _host_port(item: str, url: str, default_port: int = SENTINEL_PORT) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(f"//{item.strip()}")
    try:
        port = parsed.port or default_port
    except ValueError:
        raise ValueError(f"bad address {item!r} in {url!r}") from None
    if not parsed.hostname:
        raise ValueError(f"bad address {item!r} in {url!r}")
    return parsed.hostname, port


def connect(url: str, *, socket_timeout: float | None, max_connections: int | None = None) -> redis.Redis:
    """A client whose blocking calls may run up to socket_timeout seconds.

    One immediate retry replaces a pooled connection that died with a Redis
    restart or a failover; anything longer is the caller's to decide (503, or backoff).
    """
    options: dict[str, Any] = dict(
        socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=socket_timeout,
        health_check_interval=30, max_connections=max_connections or 256, timeout=CONNECT_TIMEOUT_S,
        # The retry is for a connection that died (a restart, a failover), not for a Redis that
        # answers nothing: retrying a timeout only doubles the wait (and its reconnect's handshake waits too).
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)), retry_on_error=[redis.ConnectionError])
    if is_sentinel(url):
        return _primary_of(parse_sentinel_url(url), options)
    if is_cluster(url):
        return _cluster_of(parse_cluster_url(url), options)  # type: ignore[return-value]
    pool = redis.BlockingConnectionPool.from_url(url, **options)
    return redis.Redis(connection_pool=pool)


def _cluster_of(url: ClusterURL, options: dict[str, Any]) -> RedisCluster:
    # RedisCluster retries at the cluster level (refreshing the slot map between tries) and gives
    # each node's client no retry of its own; its node pools take no health checks or timeout.
    node = {k: v for k, v in options.items() if k not in ("health_check_interval", "retry", "retry_on_error",
                                                          "timeout")}
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in url.nodes],
                        retry=Retry(NoBackoff(), 1), **{**node, **url.options})


def on_cluster(client: redis.Redis) -> bool:
    """Whether connect() gave a Redis Cluster client (Keys(cluster=...) follows it)."""
    return isinstance(client, RedisCluster)


def scan_keys(client: redis.Redis, match: str, count: int = 500):
    """SCAN for keys matching a pattern: on a cluster, on every primary (each holds its own slots)."""
    if on_cluster(client):
        return client.scan_iter(match=match, count=count, target_nodes=RedisCluster.PRIMARIES)
    return client.scan_iter(match=match, count=count)


def _primary_of(url: SentinelURL, options: dict[str, Any]) -> redis.Redis:
    # Asking a Sentinel must not wait out a dead one: fail fast, go to the next.
    sentinels = _Sentinels(url.sentinels, sentinel_kwargs={
        "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": SENTINEL_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0), **url.sentinel})
    connection_class = _PrimarySSLConnection if url.tls else _PrimaryConnection
    return sentinels.master_for(url.service, connection_pool_class=_BlockingSentinelPool,
                                connection_class=connection_class, **{**options, **url.primary})


class _Sentinels(Sentinel):
    """redis-py's Sentinel, asked by one thread at a time: discover_master reorders the list of
    Sentinels in place, which the many connections that reconnect together after a failover
    could otherwise garble (a Sentinel listed twice, another lost)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock, self._pid = threading.Lock(), os.getpid()

    def discover_master(self, service_name):
        if self._pid != os.getpid():  # a fork copies the lock in whatever state it was in
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            return super().discover_master(service_name)


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A Sentinel pool that waits up to `timeout` for a free connection, as the plain URL's
    BlockingConnectionPool does, instead of failing at once when all are in use."""


class _PrimaryConnection(SentinelManagedConnection):
    """redis-py drops a connection to the primary that answers READONLY (it was demoted) and
    raises ConnectionError, so the retry asks the Sentinels again; this does the same when the
    refusal comes back as a script error (Redis 6), as it does for Funnel's Lua scripts."""

    def read_response(self, *args: Any, **kwargs: Any):
        try:
            return super().read_response(*args, **kwargs)
        except redis.ResponseError as exc:
            if self.connection_pool.is_master and _READONLY_IN_SCRIPT in str(exc):
                self.disconnect()
                raise redis.ConnectionError("the primary was demoted to a replica") from exc
            raise


class _PrimarySSLConnection(_PrimaryConnection, SSLConnection):
    pass


def node_client(client: redis.Redis, key: str) -> redis.Redis:
    """The client of the one Redis that holds `key`: on a Redis Cluster its slot's node's own, else the
    client itself. A pipeline of it is sent on one connection, as WAIT needs (it counts the writes of
    its own connection), where each call of a cluster client may take another."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client

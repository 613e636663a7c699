"""FUNNEL_REDIS_URL: plain URLs as redis-py reads them, redis+sentinel:// taken apart, the clients built."""

import time

import pytest
import redis
from redis.exceptions import RedisClusterException
from redis.sentinel import SentinelConnectionPool

from funnel.common.link import connection
from funnel.common.link.connection import connect, is_cluster, is_sentinel, parse_cluster_url, parse_sentinel_url
from funnel.scripts.redis_local import free_port


def test_a_sentinel_url_names_its_sentinels_service_and_db():
    url = parse_sentinel_url("redis+sentinel://s1.internal:26380,10.0.0.2:26381,s3/funnel/2")
    assert url.sentinels == [("s1.internal", 26380), ("10.0.0.2", 26381), ("s3", 26379)]
    assert (url.service, url.tls, url.primary["db"]) == ("funnel", False, 2)
    assert url.sentinel == {}
    assert parse_sentinel_url("redis+sentinel://s1/funnel").primary["db"] == 0
    assert parse_sentinel_url("redis+sentinel://[::1]:26379,[fd00::2]/mymaster/").sentinels == [
        ("::1", 26379), ("fd00::2", 26379)]


def test_the_password_is_the_primarys_and_sentinel_options_the_sentinels():
    url = parse_sentinel_url("redis+sentinel://app:p%40ss@s1:26379,s2:26379/funnel/0"
                             "?sentinel_password=sp&sentinel_username=watcher&socket_keepalive=yes")
    assert (url.primary["username"], url.primary["password"]) == ("app", "p@ss")
    assert url.primary["socket_keepalive"] is True  # typed as for a plain URL
    assert url.sentinel == {"username": "watcher", "password": "sp"}
    assert "sentinel_password" not in url.primary and "host" not in url.primary
    only_password = parse_sentinel_url("redis+sentinel://:secret@s1/funnel")
    assert only_password.primary["password"] == "secret" and "username" not in only_password.primary


def test_rediss_sentinel_is_tls_to_the_sentinels_and_the_primary():
    url = parse_sentinel_url("rediss+sentinel://:pw@s1:26379/funnel/1?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert url.tls
    assert url.sentinel == {"ssl": True, "ssl_cert_reqs": "none", "ssl_ca_certs": "/ca.pem"}
    assert url.primary["ssl_ca_certs"] == "/ca.pem" and "connection_class" not in url.primary


@pytest.mark.parametrize("url", [
    "redis+sentinel://s1:26379",                 # no service
    "redis+sentinel://s1:26379/",                # no service
    "redis+sentinel://s1:26379/funnel/zero",     # db not a number
    "redis+sentinel://s1:26379/funnel/0/extra",  # too deep
    "redis+sentinel:///funnel/0",                # no Sentinel
    "redis+sentinel://s1:port/funnel",           # bad port
    "redis+sentinel://s1:70000/funnel",          # port out of range
    "redis+sentinel://",
    "redis://s1:6379/0",                         # not a Sentinel URL at all
])
def test_bad_sentinel_urls_are_refused(url):
    with pytest.raises(ValueError):
        parse_sentinel_url(url)


def test_which_urls_are_sentinel_urls():
    assert is_sentinel("redis+sentinel://s1/funnel") and is_sentinel("REDISS+SENTINEL://s1/funnel")
    assert not any(map(is_sentinel, ["redis://h:6379/0", "rediss://h/0", "unix:///tmp/r.sock", "sentinel://h"]))


def test_plain_urls_keep_their_pool():
    client = connect("redis://:pw@127.0.0.1:6399/3", socket_timeout=7.0, max_connections=12)
    pool = client.connection_pool
    assert type(pool) is redis.BlockingConnectionPool
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("127.0.0.1", 6399, 3, "pw")
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7.0, connection.CONNECT_TIMEOUT_S)
    assert (pool.max_connections, pool.timeout, kwargs["health_check_interval"]) == (12, 1.0, 30)


def test_a_sentinel_url_gives_a_client_of_the_primary():
    client = connect("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/funnel/4?sentinel_password=sp",
                     socket_timeout=7.0)
    pool = client.connection_pool
    # Sentinel-managed, and blocking for a free connection like the plain pool.
    assert isinstance(pool, SentinelConnectionPool) and isinstance(pool, redis.BlockingConnectionPool)
    assert pool.service_name == "funnel" and pool.is_master
    assert pool.connection_class is connection._PrimaryConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (4, "pw", 7.0)
    assert (kwargs["socket_connect_timeout"], kwargs["health_check_interval"]) == (connection.CONNECT_TIMEOUT_S, 30)
    assert (pool.max_connections, pool.timeout) == (256, connection.CONNECT_TIMEOUT_S)
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels] == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    asked = sentinels[0].connection_pool.connection_kwargs
    assert asked["password"] == "sp" and asked["socket_timeout"] == connection.SENTINEL_TIMEOUT_S
    assert asked["retry"].get_retries() == 0  # a dead Sentinel is skipped, not retried


def test_no_sentinel_answering_is_a_connection_error_at_once():
    """The web turns a ConnectionError into a 503: with every Sentinel down it comes fast."""
    import time

    from funnel.scripts.redis_local import free_port

    client = connect(f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/funnel", socket_timeout=5)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 1.0


def test_a_refused_url_does_not_show_its_password():
    with pytest.raises(ValueError) as refused:
        parse_sentinel_url("redis+sentinel://app:hunter2@s1:26379/funnel/zero")
    assert "hunter2" not in str(refused.value) and "app:***@s1" in str(refused.value)


def test_a_cluster_url_names_its_nodes_and_their_login():
    parsed = parse_cluster_url("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2,node3:7002?socket_keepalive=yes")
    assert parsed.nodes == [("10.0.0.1", 7000), ("10.0.0.2", 6379), ("node3", 7002)]
    assert parsed.options["username"] == "u" and parsed.options["password"] == "pw"
    assert parsed.options["socket_keepalive"] is True and "ssl" not in parsed.options
    assert parse_cluster_url("rediss+cluster://h1,h2").options["ssl"] is True
    assert is_cluster("redis+cluster://h") and not is_cluster("redis://h") and not is_cluster("redis+sentinel://h/s")


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://h1/1", "redis+cluster://h1:port",
                                 "redis://h1"])
def test_bad_cluster_urls_are_refused(url):
    with pytest.raises(ValueError):
        parse_cluster_url(url)


def test_no_cluster_node_answering_fails_at_once():
    started = time.monotonic()
    with pytest.raises((redis.RedisError, RedisClusterException)):
        connect(f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}", socket_timeout=5)
    assert time.monotonic() - started < 2  # refused, not waited on

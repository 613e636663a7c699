"""connect() with a redis+sentinel:// URL against a real primary, replica and three Sentinels."""

import time

import pytest
import redis

from funnel.common.link.connection import connect
from funnel.scripts.redis_local import LocalSentinels, ask, wait_until

PUSH = "return redis.call('LPUSH', KEYS[1], ARGV[1])"  # a write from Lua, as the web's push and the worker's take


def test_a_client_follows_a_killed_primary(sentinels):
    client = connect(sentinels.url, socket_timeout=5)
    push = client.register_script(PUSH)
    push(keys=["kept"], args=["before"])
    assert client.wait(1, 2000) == 1  # on the replica too
    old = sentinels.current_primary()
    old.kill()
    failed: list[float] = []

    def pushed() -> bool:
        started = time.monotonic()
        try:
            push(keys=["kept"], args=["after"])
            return True
        except redis.ConnectionError:
            failed.append(time.monotonic() - started)
            return False

    wait_until(pushed, 15, "a write to succeed after the kill")
    new = sentinels.wait_failover(old.port)
    assert failed and max(failed) < 1.5  # refused at once while there is no primary: nothing hangs
    assert client.connection_pool.master_address == ("127.0.0.1", new)
    assert client.lrange("kept", 0, -1) == [b"after", b"before"]


def test_a_demoted_primary_is_left_at_its_first_refused_write(sentinels):
    """A connection still open to a primary that became a replica (here behind the Sentinels' back)
    must not stay there: a refused write, from Lua too, drops it as a connection error."""
    client = connect(sentinels.url, socket_timeout=5)
    push = client.register_script(PUSH)
    push(keys=["q"], args=["1"])
    primary, replica = sentinels.primary, sentinels.replica
    ask(replica.port, lambda c: c.replicaof("NO", "ONE"))
    ask(primary.port, lambda c: c.replicaof("127.0.0.1", replica.port))
    with pytest.raises(redis.ConnectionError, match="demoted"):
        push(keys=["q"], args=["2"])  # Redis 6 reports this as a script error, not READONLY
    with pytest.raises(redis.ConnectionError, match="now a slave"):
        client.lpush("q", "3")        # redis-py's own handling of READONLY


def test_passwords_go_to_the_primary_and_the_sentinels():
    with LocalSentinels(password="data-pass", sentinel_password="watch-pass") as deployment:
        client = connect(deployment.url, socket_timeout=5)
        assert client.lpush("q", "x") == 1
        without = connect(deployment.url.replace("?sentinel_password=watch-pass", ""), socket_timeout=5)
        with pytest.raises(redis.ConnectionError, match="No master found"):
            without.ping()  # every Sentinel refused the question
        wrong = connect(deployment.url.replace(":data-pass@", ":nope@"), socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()

"""The traffic policy (common/contracts/traffic.py): choosing a request's version, and the policy in Redis."""

import random
from collections import Counter

import pytest

from funnel.common.contracts import traffic

DRAWS = 20_000


def shares(weights, live, seed=29) -> dict[int, float]:
    rng = random.Random(seed)
    counts = Counter(traffic.choose(weights, live, rng) for _ in range(DRAWS))
    return {version: 100 * n / DRAWS for version, n in counts.items()}


def test_versions_take_their_weights_share():
    got = shares({1: 90, 2: 10}, {1, 2})
    assert set(got) == {1, 2}
    assert abs(got[1] - 90) < 2 and abs(got[2] - 10) < 2
    three = shares({1: 1, 2: 1, 3: 2}, {1, 2, 3})
    assert all(abs(three[v] - expected) < 2 for v, expected in ((1, 25), (2, 25), (3, 50)))


def test_a_seeded_draw_repeats():
    first = [traffic.choose({1: 50, 2: 50}, {1, 2}, random.Random(5)) for _ in range(3)]
    assert first == [traffic.choose({1: 50, 2: 50}, {1, 2}, random.Random(5)) for _ in range(3)]


def test_a_weight_on_a_version_with_no_live_worker_is_skipped():
    # Version 2 has 10% but no live worker: everything goes to version 1, nothing is refused.
    assert shares({1: 90, 2: 10}, {1}) == {1: 100.0}
    # The live weighted versions share in proportion among themselves.
    got = shares({1: 60, 2: 20, 3: 20}, {1, 2})
    assert abs(got[1] - 75) < 2 and abs(got[2] - 25) < 2 and 3 not in got


def test_zero_weight_versions_take_nothing_while_a_weighted_one_is_live():
    assert shares({1: 100, 2: 0}, {1, 2}) == {1: 100.0}


def test_with_no_policy_or_no_weighted_version_live_the_highest_live_version_takes_all():
    assert traffic.choose({}, {1, 3, 2}) == 3
    assert traffic.choose({1: 100}, {2, 3}) == 3            # version 1 is down: not a 503
    assert traffic.choose({1: 100, 3: 0}, {3}) == 3         # a zero weight still serves as the fallback
    assert traffic.choose({1: 100}, {1, 2}) == 1            # the policy wins over "highest"


def test_nothing_live_is_none():
    assert traffic.choose({1: 90, 2: 10}, set()) is None
    assert traffic.choose({}, set()) is None


@pytest.mark.parametrize(("given", "policy"), [
    ({1: 90, 2: 10}, {1: 90, 2: 10}),
    ({"1": 90, "2": "10"}, {1: 90, 2: 10}),     # JSON's string keys, the CLI's strings
    ({"3": 0, "4": 1}, {3: 0, 4: 1}),
])
def test_valid_policies(given, policy):
    assert traffic.validate(given) == policy


@pytest.mark.parametrize(("given", "message"), [
    ({}, "at least one"),
    ({1: 0, 2: 0}, "all zero"),
    ({0: 10}, "positive"),
    ({-1: 10}, "positive"),
    ({"one": 10}, "integer"),
    ({1.5: 10}, "integer"),
    ({True: 10}, "integer"),
    ({1: -5}, "negative"),
    ({1: 2.5}, "integer"),
    ({1: "lots"}, "integer"),
    ({1: None}, "integer"),
    ({1: 10, "1": 20}, "twice"),
    ([(1, 10)], "at least one"),
])
def test_invalid_policies_are_refused_with_a_reason(given, message):
    with pytest.raises(ValueError, match=message):
        traffic.validate(given)


def test_the_policy_in_redis(redis_client, keys):
    assert traffic.read(redis_client, keys, "m") == {}
    assert traffic.write(redis_client, keys, "m", {"1": 90, "2": 10}) == {1: 90, 2: 10}
    assert redis_client.hgetall(keys.traffic("m")) == {b"1": b"90", b"2": b"10"}
    assert traffic.read(redis_client, keys, "m") == {1: 90, 2: 10}
    traffic.write(redis_client, keys, "m", {3: 100})       # replaced whole, not merged
    assert traffic.read(redis_client, keys, "m") == {3: 100}
    with pytest.raises(ValueError):
        traffic.write(redis_client, keys, "m", {1: 0})
    assert traffic.read(redis_client, keys, "m") == {3: 100}  # a refused policy writes nothing
    assert traffic.read(redis_client, keys, "other") == {}
    traffic.clear(redis_client, keys, "m")
    assert traffic.read(redis_client, keys, "m") == {} and not redis_client.exists(keys.traffic("m"))


def test_fields_written_by_hand_that_are_no_policy_are_left_out(redis_client, keys):
    redis_client.hset(keys.traffic("m"), mapping={"1": "50", "two": "5", "3": "x", "0": "9", "4": "-1", "5": "7"})
    assert traffic.read(redis_client, keys, "m") == {1: 50, 5: 7}


def test_a_policy_reads_as_the_cli_takes_it():
    assert traffic.describe({2: 10, 1: 90}) == "1=90 2=10" and traffic.describe({}) == ""

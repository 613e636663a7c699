"""A model's traffic policy: which share of its unpinned requests each version takes.

The policy lives in Redis, `funnel:traffic:{<model>}`, a hash of version ->
weight (both decimal strings), e.g. {1: 90, 2: 10}: 90% of the requests to
version 1, 10% to version 2. It is written whole (`write` replaces it in one
step), read by every web process, and set with `funnel traffic NAME 1=90 2=10`
or `PUT /v1/models/NAME/traffic`. This module is its one home: how it is
stored, what a valid policy is, and how a request's version is chosen.

`choose` never answers "nobody" while a version can serve: a weight on a
version with no live worker is skipped, and with no policy (or no weighted
version live) the highest live version takes everything.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

import redis

from funnel.common.contracts.keys import Keys

_RNG = random.Random()
_DECIMAL = re.compile(r"^[+-]?[0-9]+$")


def _integer(value: Any, what: str) -> int:
    """An int from an int or a decimal string ("90"); never a bool, a float or anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DECIMAL.match(value.strip()):
        return int(value.strip())
    raise ValueError(f"{what} must be an integer, not {value!r}")


def validate(weights: Mapping[Any, Any]) -> dict[int, int]:
    """A policy as {version: weight}, from ints or decimal strings ({"1": 90, "2": 10} as JSON
    gives it). Versions are positive integers, weights non-negative integers, and not all zero;
    anything else raises ValueError saying what is wrong."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError("a traffic policy needs at least one version=weight")
    policy: dict[int, int] = {}
    for key, value in weights.items():
        version = _integer(key, "a version")
        if version < 1:
            raise ValueError(f"a version is a positive integer, not {key!r}")
        weight = _integer(value, f"the weight of version {version}")
        if weight < 0:
            raise ValueError(f"the weight of version {version} must not be negative ({weight})")
        if version in policy:
            raise ValueError(f"version {version} is given twice")
        policy[version] = weight
    if not any(policy.values()):
        raise ValueError("the weights are all zero: at least one version needs a positive weight "
                         "(clear the policy instead to send everything to the highest live version)")
    return policy


def read(client: redis.Redis, keys: Keys, model: str) -> dict[int, int]:
    """The model's policy, {version: weight}; {} when it has none. Fields that are not a version
    and a weight (written by hand) are left out."""
    raw: dict[bytes, bytes] = client.hgetall(keys.traffic(model))  # type: ignore[assignment]
    policy = {}
    for field, value in raw.items():
        try:
            version, weight = int(field), int(value)
        except ValueError:
            continue
        if version >= 1 and weight >= 0:
            policy[version] = weight
    return dict(sorted(policy.items()))


def write(client: redis.Redis, keys: Keys, model: str, weights: Mapping[Any, Any]) -> dict[int, int]:
    """Replace the model's policy with these weights in one step (validate's rules; ValueError
    otherwise, and nothing written). Returns the policy written."""
    policy = validate(weights)
    key = keys.traffic(model)
    pipe = client.pipeline(transaction=True)  # one key: one slot on a cluster too
    pipe.delete(key)
    pipe.hset(key, mapping={str(version): str(weight) for version, weight in policy.items()})
    pipe.execute()
    return policy


def clear(client: redis.Redis, keys: Keys, model: str) -> None:
    """No policy: every request goes to the highest version with a live worker."""
    client.delete(keys.traffic(model))


def choose(weights: Mapping[int, int], live: set[int] | frozenset[int],
           rng: random.Random | None = None) -> int | None:
    """The version a request goes to: among versions with weight > 0 that are live, at random in
    proportion to their weights; if none of those is live (or there is no policy), the highest
    live version; None when no version is live."""
    total, candidates = 0, []
    for version, weight in sorted(weights.items()):
        if weight > 0 and version in live:
            total += weight
            candidates.append((total, version))
    if candidates:
        if len(candidates) == 1:
            return candidates[0][1]
        draw = (rng or _RNG).randrange(total)
        for bound, version in candidates:
            if draw < bound:
                return version
    return max(live) if live else None


def describe(weights: Mapping[int, int]) -> str:
    """A policy as `1=90 2=10` (what `funnel traffic` prints and takes); "" for none."""
    return " ".join(f"{version}={weight}" for version, weight in sorted(weights.items()))

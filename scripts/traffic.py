"""`funnel traffic`: show, set or clear a model's traffic policy (the share each version takes).

    funnel traffic NAME                 # the policy, and each version's live workers
    funnel traffic NAME 1=90 2=10       # 90% of NAME's requests to version 1, 10% to version 2
    funnel traffic NAME 2=100           # all to version 2 (while it has a live worker)
    funnel traffic NAME --clear         # no policy: all to the highest version with a live worker

A weight on a version with no live worker is skipped, never answered 503,
while another version can serve. Requests pinned to a version
(/v1/models/NAME/versions/N/predict) ignore the policy. The policy lives in
Redis (funnel:traffic:{NAME}); every web process follows a change at once.
"""

from __future__ import annotations

import argparse
import os
import sys

import redis

from funnel.common.contracts import registry, traffic
from funnel.common.contracts.keys import Keys, check_name
from funnel.common.link.connection import connect
from funnel.common.store import list_versions


def parse_weights(pairs: list[str]) -> dict[int, int]:
    """["1=90", "2=10"] -> {1: 90, 2: 10}; ValueError saying what is wrong."""
    weights: dict[str, str] = {}
    for pair in pairs:
        version, sep, weight = pair.partition("=")
        if not sep or not version or not weight:
            raise ValueError(f"give VERSION=WEIGHT, e.g. 1=90, not {pair!r}")
        if version.strip() in weights:
            raise ValueError(f"version {version.strip()} is given twice")
        weights[version.strip()] = weight.strip()
    return traffic.validate(weights)


def show(client: redis.Redis, keys: Keys, model: str) -> str:
    weights = traffic.read(client, keys, model)
    workers = registry.live_workers(client, keys)
    live: dict[int, int] = {}
    for worker in workers:
        if worker.get("model") == model:
            version = registry.version_of(worker)
            live[version] = live.get(version, 0) + 1
    serving = {v: w for v, w in weights.items() if w > 0 and live.get(v)}  # what choose() draws among
    total = sum(serving.values())
    lines = [f"{model}: " + (f"traffic {traffic.describe(weights)}" if weights
                             else "no traffic policy: every request to the highest version with a live worker")]
    for version in sorted(set(weights) | set(live)):
        share = f"{100 * serving[version] / total:5.1f}% now" if version in serving else "   -      "
        note = "" if live.get(version) or not weights.get(version) else "  (no live worker: skipped)"
        lines.append(f"  version {version:<4} weight {weights.get(version, '-')!s:<6} {share}  "
                     f"live workers {live.get(version, 0)}{note}")
    chosen = traffic.choose(weights, set(live))
    if weights and chosen is not None and not serving:
        lines.append(f"  no weighted version is live: everything goes to version {chosen}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel traffic", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("name", help="the model")
    p.add_argument("weights", nargs="*", metavar="VERSION=WEIGHT",
                   help="the new policy, replacing the old one whole: non-negative integer weights, not all 0")
    p.add_argument("--clear", action="store_true", help="remove the policy")
    p.add_argument("--redis-url", default=os.environ.get("FUNNEL_REDIS_URL", "redis://127.0.0.1:6390/0"),
                   help="the Redis of the running Funnel (default: FUNNEL_REDIS_URL, else %(default)s)")
    p.add_argument("--prefix", default=os.environ.get("FUNNEL_PREFIX", "funnel"),
                   help="prefix of every Redis key (default: FUNNEL_PREFIX, else %(default)s)")
    p.add_argument("--model-store", metavar="DIR", default=os.environ.get("FUNNEL_MODEL_STORE", "model_store"),
                   help="where the model's versions are: a weight for a version it lacks is refused "
                        "(not checked when the model is not there) (default: FUNNEL_MODEL_STORE, else %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        check_name(args.name)
        weights = parse_weights(args.weights) if args.weights else None
    except ValueError as exc:
        p.error(str(exc))
    if args.clear and weights is not None:
        p.error("--clear takes no weights")
    known = list_versions(args.model_store, args.name)
    unknown = sorted(set(weights or ()) - set(known)) if known else []
    if unknown:
        p.error(f"{args.name} has no version {unknown[0]} in {args.model_store} "
                f"(it has {', '.join(map(str, known))})")
    client = connect(args.redis_url, socket_timeout=10)
    keys = Keys(args.prefix)
    if args.clear:
        traffic.clear(client, keys, args.name)
    elif weights is not None:
        traffic.write(client, keys, args.name, weights)
    print(show(client, keys, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per API key limits: a rate (requests per second, with a burst) and a cap on requests under way,
on each model, enforced across every web process by the push script (common/link/lua/push.lua), and
the highest priority lane its requests may ask for (common/contracts/priority.py).

FUNNEL_KEY_LIMITS names them by key label (FUNNEL_API_KEYS' `label=KEY`), as
JSON, or `@path` to a JSON file; "*" applies to every key not listed:

    {"alice": {"rate": 20, "burst": 40, "concurrency": 8, "priority": "high"},
     "*":     {"rate": 5, "priority": "normal"}}

Never from a request. A key past its rate, or with `concurrency` requests
under way, is answered 429 with Retry-After; a request asking for a lane above
the key's `priority` (default high: any) is served in the key's highest lane. Limits are per model, as each
model's workers are a capacity of their own: a key limited to 5 requests per
second may send 5 to each model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from funnel.common.contracts import priority

ANY_KEY = "*"
FIELDS = ("rate", "burst", "concurrency")  # numbers; and "priority", a lane


@dataclass(frozen=True, kw_only=True)
class Limit:
    rate: float = 0.0  # requests per second (0: none)
    burst: float = 0.0  # requests at once from a full bucket (default: one second's rate, at least 1)
    concurrency: int = 0  # requests under way at most (0: no cap)
    priority: str = priority.HIGH  # the highest lane its requests are served in

    def script_args(self) -> list[float | int]:
        """push.lua's ARGV[11..13]."""
        return [self.rate, self.burst or max(1.0, self.rate), self.concurrency]


def parse(text: str) -> dict[str, Limit]:
    """FUNNEL_KEY_LIMITS (JSON, or @path to a JSON file) -> label -> Limit; ValueError saying what is wrong."""
    if not text.strip():
        return {}
    source = "FUNNEL_KEY_LIMITS"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise ValueError(f"FUNNEL_KEY_LIMITS: cannot read {source}: {exc.strerror}") from None
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{source}: not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{source}: a JSON object of key label -> limits")
    limits = {}
    for label, fields in given.items():
        if not isinstance(fields, dict) or set(fields) - {*FIELDS, "priority"}:
            raise ValueError(f"{source}: {label!r} takes an object of {', '.join(FIELDS)}, priority")
        highest = fields.get("priority", priority.HIGH)
        if highest not in priority.LANES:
            raise ValueError(f"{source}: {label!r}'s priority must be one of {', '.join(priority.LANES)}")
        values = {name: fields.get(name, 0) for name in FIELDS}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values.values()):
            raise ValueError(f"{source}: {label!r}'s limits must be numbers >= 0")
        if not float(values["concurrency"]).is_integer():
            raise ValueError(f"{source}: {label!r}'s concurrency must be a whole number")
        limits[label] = Limit(rate=float(values["rate"]), burst=float(values["burst"]),
                              concurrency=int(values["concurrency"]), priority=highest)
    return limits


def of(limits: dict[str, Limit], label: str) -> Limit | None:
    """The limits of the key with this label (None: not limited)."""
    found = limits.get(label) or limits.get(ANY_KEY)
    return found if found and (found.rate or found.concurrency) else None


def highest_lane(limits: dict[str, Limit], label: str) -> str:
    """The highest lane the key with this label may ask for."""
    found = limits.get(label) or limits.get(ANY_KEY)
    return found.priority if found else priority.HIGH

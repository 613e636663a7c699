"""Priorities: the lanes a model version's interactive requests wait in, and how clients name them.

Three lanes, each its own list (`Keys.queue(model, version, lane)`), served in
this order, then the bulk queue (the items of async and bulk jobs) below low:

    high     funnel:queue-high:{<model>}:<version>
    normal   funnel:queue:{<model>}:<version>          (the queue as it always was)
    low      funnel:queue-low:{<model>}:<version>
    bulk     funnel:bulk:{<model>}:<version>

A worker fills each batch from the lanes in that order, but every lane below
the first keeps a floor share of the places while it has work waiting
(worker/lanes.py), so none starves however busy the lanes above it are. The
push script counts a request's wait from its own lane and the lanes above it:
a low request is refused first, when the queue is full or its predicted wait
is past its deadline.

Clients name a lane with `X-Priority: high | normal | low` (any HTTP route), or
the Open Inference Protocol's `priority` parameter (/v2, gRPC), which Triton
numbers (0 the default, 1 the highest): 1 is high, 0 and 2 normal, 3 and more
low; the names are taken there too. An API key may be allowed no higher than a
lane (FUNNEL_KEY_LIMITS `priority`, web/queueing/limits.py): a request asking
above it is served in the key's highest lane, and its answer says which
(the `X-Priority` header, /v1's `meta.priority`), as OpenAI answers the
service tier it used.
"""

from __future__ import annotations

from typing import Any

from funnel.common.errors import BadInput

HIGH, NORMAL, LOW = "high", "normal", "low"
LANES = (HIGH, NORMAL, LOW)  # in the order a worker serves them


def parse(value: Any) -> str:
    """A lane from a header's or a parameter's value: a name, or Triton's number; "" or None: normal."""
    if value is None or value == "":
        return NORMAL
    if isinstance(value, bool):
        raise _bad(value)
    if isinstance(value, int):
        if value < 0:
            raise _bad(value)
        return HIGH if value == 1 else NORMAL if value in (0, 2) else LOW
    if isinstance(value, str):
        name = value.strip().lower()
        if name in LANES:
            return name
        if name.isascii() and name.isdigit() and len(name) < 20:  # int() refuses "²"
            return parse(int(name))
    raise _bad(value)


def _bad(value: Any) -> BadInput:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return BadInput(f"priority {shown}: one of high, normal, low (or Triton's 1, 2, 3)", code="bad_priority")


def at_most(lane: str, highest: str) -> str:
    """The lane served: the one asked for, or the highest allowed when it asks above it."""
    return LANES[max(LANES.index(lane), LANES.index(highest))]

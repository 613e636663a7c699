"""The result cache's contract: which models cache, under which key an item's result lies, and
how an entry is read back.

A model caches where its model.json says so (`"cache": {"ttl_s": 3600, "shared": false}`; `funnel
add --cache-ttl`). An item's entry is keyed by the model, the version and the digest of what the
model is fed for it (its preprocessed tensors: names, dtypes, shapes and bytes, and whether the
model's own rows or the task's result were asked for), so two encodings of one picture, or two
spellings its tokenizer reads alike, share an entry, and a new version starts cold. With API keys
set, an entry is its key's own (the scope is the key's owner hash) unless the model declares its
cache shared: a hit must not tell one tenant what another sent.

An entry is the reply that answered the item, wire bytes (common/contracts/wire.py), written by the
worker's reply script (common/link/lua/reply.lua) with the TTL, read by the web tier's push script
(common/link/lua/push.lua). Whatever fails to decode as a one-item success is a miss.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from funnel.common.contracts.wire import Reply, WireError, decode_reply

SHARED = "shared"  # the scope of an entry anyone may hit: no API keys, or a model that shares its cache
SCOPE_CHARS = 32  # of the owner hash: 128 bits name a key's entries


@dataclass(frozen=True)
class CachePolicy:
    """A model version's cache, from its model.json's `cache`: off unless ttl_s is positive."""

    ttl_s: int = 0  # an entry's life, seconds (0: the cache is off)
    shared: bool = False  # with API keys set, one entry for every key (else one per key)

    @property
    def on(self) -> bool:
        return self.ttl_s > 0

    @classmethod
    def of(cls, config: dict[str, Any]) -> CachePolicy:
        """The policy a model.json states; ValueError for one that is not a policy."""
        stated = config.get("cache")
        if stated is None:
            return cls()
        if not isinstance(stated, dict) or set(stated) - {"ttl_s", "shared"}:
            raise ValueError('model.json "cache" is {"ttl_s": seconds, "shared": true or false}')
        ttl_s, shared = stated.get("ttl_s", 0), stated.get("shared", False)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 0 or not isinstance(shared, bool):
            raise ValueError('model.json "cache": ttl_s is whole seconds, at least 0; shared is true or false')
        return cls(ttl_s, shared)

    def scope(self, owner: str) -> str:
        """Whose entries a caller reads and writes: its API key's (owner: the key's owner hash, ""
        where the server has no keys), or everyone's."""
        return owner[:SCOPE_CHARS] if owner and not self.shared else SHARED


def digest(inputs: dict[str, np.ndarray], raw: bool, context: dict[str, Any] | None = None) -> str:
    """128 bits of BLAKE2b over an item's named tensors as the model is fed them, and its context
    where the task's result reads one (a letterbox's scale: one picture at two sizes feeds the same
    pixels but answers different boxes); raw rows do not read it."""
    h = hashlib.blake2b(b"raw" if raw else b"result", digest_size=16)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        h.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        h.update(array.data)
    if context is not None and not raw:
        h.update(b"\0context\0" + msgpack.packb(context, use_bin_type=True))
    return h.hexdigest()


def ident(scope: str, item_digest: str) -> str:
    """An item's ident in the cache's keys (common/contracts/keys.py's cache, cache_pending)."""
    return f"{scope}:{item_digest}"


def entry_reply(data: Any) -> Reply | None:
    """A cache entry as the one item's reply it holds, as a hit answers it (no batch ran for it:
    no batch size, queue or inference time); None for anything else (a miss)."""
    try:
        reply = decode_reply(data)
    except WireError:
        return None
    if not reply.ok or reply.items is not None or reply.outputs is None:
        return None
    reply.batch_size, reply.queue_ms, reply.infer_ms = 0, 0.0, 0.0
    return reply

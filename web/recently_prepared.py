"""A cached model's items as this web process last preprocessed them.

A model that caches its results (common/result_cache.py) says its items repeat. Its entries are
keyed by what the model is fed, after preprocessing, so without this a repeated item paid the
tokenizer or the JPEG decode again only to find its answer known (docs/performance.md, "The result
cache"). Each web process keeps the items it prepared lately: keyed by the model version, the
caller's cache scope (one tenant learns nothing of another's items, not even by how fast they are
answered) and the item itself (a text, an image's bytes, an upload); the tensors and context that
preprocessing gave, read-only. MAX_BYTES of items and tensors at most a process, the least recently
used dropped first. JSON items and the model's own tensors are prepared every time.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any

from funnel.common.tasks import Context, Inputs, Upload

MAX_BYTES = 64 << 20  # a web process's prepared items, at most: tensors and the items they came from
ENTRY_BYTES = 256  # what an entry's key, tuple and dict cost beyond their bytes, about

Key = tuple[str, int, str, Any]
Pair = tuple[Inputs, "Context | None"]  # an item as preprocess gave it: its tensors and context


def kept(item: Any) -> bool:
    """Whether an item is one this keeps: a text, bytes, or an upload (hashable, and sized)."""
    return type(item) in (str, bytes, Upload)


class RecentlyPrepared:
    """The least recently used prepared items, MAX_BYTES at most."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[Key, tuple[Pair, int]] = OrderedDict()
        self._lock = threading.Lock()  # the gRPC service prepares on its threads

    def get(self, key: Key) -> Pair | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: Key, inputs: Inputs, context: Context | None) -> None:
        for array in inputs.values():
            array.flags.writeable = False  # shared by every later request of the item
        size = ENTRY_BYTES + _item_bytes(key[3]) + sum(array.nbytes for array in inputs.values())
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= old[1]
            self._items[key] = ((inputs, context), size)
            self.size += size
            while self.size > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.size -= dropped


def _item_bytes(item: Any) -> int:
    if type(item) is Upload:
        return sys.getsizeof(item.data) + sys.getsizeof(item.content_type)
    return sys.getsizeof(item)

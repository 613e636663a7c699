"""The threads of the worker's loop (its stages) and what passes between them.

A `Slot` holds one batch handed from one thread to the next; a `Stage` is a
thread that runs one step of the loop over and over, and keeps the exception
that ended it for the main thread to raise. worker/main.py puts them
together: the taker fills a slot the run empties, the run fills a slot the
replier empties.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Handed = TypeVar("Handed")


class Slot(Generic[Handed]):
    """Room for one item: put waits while it is full, get while it is empty.

    Closing it ends the stream: get answers None once it is empty, and a put
    after the other side closed it is refused (False) instead of waiting.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._item: Handed | None = None
        self._closed = False

    def put(self, item: Handed) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self._item is None or self._closed)
            if self._closed:
                return False
            self._item = item
            self._changed.notify_all()
            return True

    def get(self) -> Handed | None:
        with self._changed:
            self._changed.wait_for(lambda: self._item is not None or self._closed)
            item, self._item = self._item, None
            self._changed.notify_all()
            return item

    def wait_empty(self) -> None:
        """Until the item put last has been taken (or the slot closed)."""
        with self._changed:
            self._changed.wait_for(lambda: self._item is None or self._closed)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class Stage:
    """A thread running `body` until it returns, closing `slots` on the way out.

    A body that raises stops the whole worker (it sets `stop`), and join()
    raises its exception in the caller's thread.
    """

    def __init__(self, name: str, body: Callable[[], None], stop: threading.Event, slots: list[Slot]):
        self.body, self.stop, self.slots = body, stop, slots
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Stage:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.body()
        except BaseException as exc:
            self.error = exc
            self.stop.set()
        finally:
            for slot in self.slots:
                slot.close()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error

"""The models and versions a web process serves, as the model store has them now.

The store is looked at again at most every RESCAN_S (on the next request
after that), so a model or version added with `funnel add`, or removed, is
served or dropped without a restart. A version's task is loaded once, and
again if its model.json changes; one that fails to load is logged and left
out, and the others go on being served. FUNNEL_MODELS, when set, names the
models served (their versions still come and go); else every model in the
store is.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from funnel.common import tasks
from funnel.common.store import list_models, list_versions, load_spec
from funnel.common.tasks import Task

log = logging.getLogger("funnel.web")

RESCAN_S = 5.0  # a change in the store is served this soon (the issue asks for 10 s)


class Catalog:
    def __init__(self, store: str | Path, names: list[str], limits: dict[str, int], rescan_s: float = RESCAN_S,
                 clock=time.monotonic):
        self.store, self.names_given, self.limits = Path(store), names, limits
        self.rescan_s, self.clock = rescan_s, clock
        self._loaded: dict[tuple[str, int], tuple[float, Task]] = {}  # (name, version) -> (mtime, task)
        self._served: dict[str, dict[int, Task]] = {}
        self._scanned_at = -float("inf")
        self._lock = threading.Lock()
        self.rescan()

    def versions(self, name: str) -> dict[int, Task]:
        """The served versions of a model and their tasks ({}: not served)."""
        self._fresh()
        return self._served.get(name, {})

    def names(self) -> list[str]:
        self._fresh()
        return list(self._served)

    def tasks(self) -> list[Task]:
        """The task of each served model's highest version."""
        self._fresh()
        return [versions[max(versions)] for versions in self._served.values()]

    def _fresh(self) -> None:
        if self.clock() - self._scanned_at >= self.rescan_s and self._lock.acquire(blocking=False):
            try:
                self._rescan()
            finally:
                self._lock.release()

    def rescan(self) -> None:
        """Read the store now (after this process added to it), waiting for a rescan under way."""
        with self._lock:
            self._rescan()

    def _rescan(self) -> None:
        """Read the store: the models and versions in it now, their tasks loaded where new or changed."""
        served: dict[str, dict[int, Task]] = {}
        for name in self.names_given or list_models(self.store):
            for version in list_versions(self.store, name):
                task = self._task(name, version)
                if task is not None:
                    served.setdefault(name, {})[version] = task
        self._served, self._scanned_at = served, self.clock()

    def _task(self, name: str, version: int) -> Task | None:
        try:
            spec = load_spec(self.store, name, version)
            mtime = (spec.path / "model.json").stat().st_mtime
            loaded = self._loaded.get((name, version))
            if loaded is None or loaded[0] != mtime:
                task = tasks.load(spec, self.limits)
                task.load_files()  # now: the folder may go before this process's next scan
                loaded = self._loaded[name, version] = (mtime, task)
            return loaded[1]
        except Exception:  # a half-written or broken entry: the others go on being served
            log.exception("model %s version %s could not be loaded; not served", name, version)
            return None
